"""Write the vision-language demo data: pictures of 1 to 4 coloured shapes (circles, squares, triangles in red,
green, blue or yellow on white, 64x64 pixels), each with a two-turn conversation about it (what colour, how many
and which shape), as data/demo/vlm/images/*.png and data/demo/vlm/train.jsonl / eval.jsonl (a held-out split: no
picture of it is in the training file); and two preference pairs per picture for DPO, pairs_train.jsonl /
pairs_eval.jsonl (the same split): the right count against a wrong one, and after the count, the right colour and
shape against the wrong colour. Deterministic and offline: the same files on every run.

    python scripts/make_vlm_demo.py               # -> data/demo/vlm/
    python scripts/make_vlm_demo.py --out /tmp/vlm

Rows are OpenAI messages with image parts, paths relative to the data file:
{"messages": [{"role": "user", "content": [{"type": "image", "image": "images/3_red_circle.png"},
  {"type": "text", "text": "How many shapes are there?"}]}, {"role": "assistant", "content": "Three."}, ...]}
Trained by configs/vlm_lora_demo.yaml with a vision-language model of your own (Qwen2.5-VL, Gemma 3, SmolVLM), then
configs/dpo_vlm_lora_demo.yaml on the pairs.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
SIZE = 64
COLORS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 20)}
SHAPES = ("circle", "square", "triangle")
COUNT_WORDS = {1: "One", 2: "Two", 3: "Three", 4: "Four"}
HELD_OUT = 12
FIRST_QUESTIONS = ("How many shapes are there?", "Count the shapes in the picture.", "How many shapes do you see?")
SECOND_QUESTIONS = ("What colour and shape are they?", "Describe them.", "Which colour and which shape?")


def draw(count: int, color: tuple[int, int, int], shape: str, rng: random.Random):
    """The picture: `count` shapes of 14 pixels in cells of a 2x2 grid, each nudged a little."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), "white")
    canvas = ImageDraw.Draw(image)
    cells = rng.sample([(0, 0), (1, 0), (0, 1), (1, 1)], count)
    for cx, cy in cells:
        x, y = cx * 32 + 8 + rng.randint(-3, 3), cy * 32 + 8 + rng.randint(-3, 3)
        box = (x, y, x + 14, y + 14)
        if shape == "circle":
            canvas.ellipse(box, fill=color)
        elif shape == "square":
            canvas.rectangle(box, fill=color)
        else:
            canvas.polygon([(x + 7, y), (x, y + 14), (x + 14, y + 14)], fill=color)
    return image


def conversation(path: str, count: int, color: str, shape: str, rng: random.Random) -> dict:
    plural = shape if count == 1 else shape + "s"
    answer = f"{'It is' if count == 1 else 'They are'} {color} {plural}."
    return {"messages": [
        {"role": "user", "content": [{"type": "image", "image": path},
                                     {"type": "text", "text": rng.choice(FIRST_QUESTIONS)}]},
        {"role": "assistant", "content": f"{COUNT_WORDS[count]}."},
        {"role": "user", "content": rng.choice(SECOND_QUESTIONS)},
        {"role": "assistant", "content": answer}]}


def preference_pairs(row: dict, rng: random.Random) -> list[dict]:
    """The conversation's two replies, each as a pair against a wrong one: a wrong count, then (after the right
    count) the wrong colour. Only the picture tells which reply is right."""
    ask_count, count_reply, ask_colour, answer = row["messages"]
    count = next(n for n, word in COUNT_WORDS.items() if count_reply["content"] == f"{word}.")
    wrong_count = rng.choice([n for n in COUNT_WORDS if n != count])
    color = next(c for c in COLORS if f" {c} " in answer["content"])
    wrong_color = rng.choice([c for c in COLORS if c != color])
    return [{"prompt": [ask_count], "chosen": count_reply["content"], "rejected": f"{COUNT_WORDS[wrong_count]}."},
            {"prompt": [ask_count, count_reply, ask_colour], "chosen": answer["content"],
             "rejected": answer["content"].replace(f" {color} ", f" {wrong_color} ")}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "demo" / "vlm")
    args = parser.parse_args()
    rng = random.Random(SEED)
    (args.out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for count in COUNT_WORDS:
        for color, rgb in COLORS.items():
            for shape in SHAPES:
                name = f"images/{count}_{color}_{shape}.png"
                draw(count, rgb, shape, rng).save(args.out / name)
                rows.append(conversation(name, count, color, shape, rng))
    rng.shuffle(rows)
    pair_rng = random.Random(SEED + 1)  # its own draws: the conversations stay as they were before the pairs
    for split, part in (("eval", rows[:HELD_OUT]), ("train", rows[HELD_OUT:])):
        write_jsonl(args.out / f"{split}.jsonl", part, "conversations")
        write_jsonl(args.out / f"pairs_{split}.jsonl", [p for r in part for p in preference_pairs(r, pair_rng)],
                    "preference pairs")


def write_jsonl(path: Path, rows: list[dict], what: str) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{path}: {len(rows)} {what}")


if __name__ == "__main__":
    main()
