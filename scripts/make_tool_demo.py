"""Write the tool-calling demo data: data/demo/tools.jsonl (training conversations in the OpenAI
format: a user asks, the assistant calls a function, the tool answers, the assistant replies) and
data/demo/tools_heldout.jsonl (new questions with the call a tuned model should make, in
`expected_call`). Deterministic: the same files every run.

    python scripts/make_tool_demo.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "demo"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                                        "to": {"type": "string"}}, "required": ["amount", "from", "to"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
CITIES = ["Paris", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Lima", "Oslo", "Seoul", "Delhi", "Sydney", "Toronto",
          "Nairobi", "Dublin", "Vienna", "Lisbon", "Prague", "Athens", "Bangkok", "Chicago", "Denver", "Zurich"]
HELD_OUT_CITIES = ["Helsinki", "Manila", "Bogota", "Warsaw", "Istanbul", "Hanoi", "Boston", "Munich"]
CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CNY", "CHF", "CAD", "INR"]
WEATHER_ASKS = ["What's the weather in {city}?", "Is it raining in {city} right now?", "How warm is it in {city}?",
                "Weather in {city}, please.", "Tell me the weather for {city}."]
TIME_ASKS = ["What time is it in {city}?", "Current time in {city}?", "Tell me the local time in {city}."]
MONEY_ASKS = ["Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?",
              "What is {amount} {src} worth in {dst}?"]
CONDITIONS = ["sunny", "cloudy", "light rain", "windy", "clear", "snowing"]


def example(rng: random.Random, cities: list[str]) -> tuple[str, dict, str, str]:
    """(question, call, tool result, final answer)"""
    kind = rng.choice(["weather", "time", "money"])
    if kind == "weather":
        city = rng.choice(cities)
        temp, sky = rng.randint(-5, 35), rng.choice(CONDITIONS)
        return (rng.choice(WEATHER_ASKS).format(city=city), {"name": "get_weather", "arguments": {"city": city}},
                json.dumps({"city": city, "temperature_c": temp, "conditions": sky}),
                f"It is {temp}°C and {sky} in {city}.")
    if kind == "time":
        city = rng.choice(cities)
        clock = f"{rng.randint(0, 23):02d}:{rng.choice(['00', '15', '30', '45'])}"
        return (rng.choice(TIME_ASKS).format(city=city), {"name": "get_time", "arguments": {"city": city}},
                json.dumps({"city": city, "time": clock}), f"It is {clock} in {city}.")
    amount = rng.choice([5, 10, 20, 50, 75, 100, 250, 1000])
    src, dst = rng.sample(CURRENCIES, 2)
    value = round(amount * rng.uniform(0.2, 5.0), 2)
    return (rng.choice(MONEY_ASKS).format(amount=amount, src=src, dst=dst),
            {"name": "convert_currency", "arguments": {"amount": amount, "from": src, "to": dst}},
            json.dumps({"amount": value, "currency": dst}), f"{amount} {src} is about {value} {dst}.")


def training_row(rng: random.Random) -> dict:
    question, call, result, answer = example(rng, CITIES)
    return {"tools": TOOLS, "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": answer},
    ]}


def held_out_row(rng: random.Random) -> dict:
    question, call, _, _ = example(rng, HELD_OUT_CITIES)
    return {"tools": TOOLS, "messages": [{"role": "user", "content": question}], "expected_call": call}


def main() -> None:
    rng = random.Random(0)
    train = [training_row(rng) for _ in range(160)]
    held_out = [held_out_row(rng) for _ in range(30)]
    for name, rows in (("tools.jsonl", train), ("tools_heldout.jsonl", held_out)):
        (OUT / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{OUT / name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
