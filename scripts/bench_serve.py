"""Server throughput and latency: requests/s, time to first token and generated tokens/s of
`chat/serve.py` under 1, 4 and 16 concurrent clients.

    .venv/bin/python scripts/bench_serve.py [--model_name_or_path M] [--adapter_name_or_path A]
        [--clients 1 4 16] [--requests_per_client 3] [--max_tokens 64]

Starts the server (greedy, --port 0, on 127.0.0.1 only) as a subprocess, sends one warm-up request,
then for each client count runs that many threads, each sending --requests_per_client streamed
requests one after another (each a different question, so prompt lengths vary) with the `openai`
client. Time to first token: from sending a request to its first chunk with text. Every loop is
bounded in count and each request in time; the server is stopped at the end. Without
--adapter_name_or_path it serves outputs/sft_demo when the quickstart made it, else the default model.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Who are you?", "What is the capital of France?", "Give me three tips for staying healthy.",
    "Explain what a neural network is in simple words.", "Write a haiku about autumn.",
    "What is the difference between a list and a tuple in Python?", "How do I make a cup of tea?",
    "Summarize the plot of Romeo and Juliet.", "Why is the sky blue?", "What are prime numbers?",
    "Translate 'good morning' into French and Spanish.", "Suggest a name for a pet turtle.",
    "你是谁？", "What should I pack for a weekend hiking trip?", "How does a bicycle stay upright?",
    "Describe the water cycle.",
]
REQUEST_TIMEOUT_S = 300


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(ROOT / "chat" / "serve.py"), "--port", "0", "--do_sample", "false",
               "--max_new_tokens", str(args.max_tokens), "--max_batch_size", str(max(args.clients))]
    if args.model_name_or_path:
        command += ["--model_name_or_path", args.model_name_or_path]
    if args.adapter_name_or_path:
        command += ["--adapter_name_or_path", args.adapter_name_or_path]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server stopped:\n{log.read_text()[-3000:]}")
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", log.read_text())
        if found:
            try:
                httpx.get(found[1] + "/health", timeout=5).raise_for_status()
                return proc, found[1]
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the server did not come up within 300 s")


def one_request(client: openai.OpenAI, model: str, question: str, max_tokens: int) -> tuple[float, float, int]:
    """(time to first text, whole time, completion tokens) of one streamed request."""
    started = time.perf_counter()
    first = None
    tokens = 0
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                            max_tokens=max_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    whole = time.perf_counter() - started
    return (whole if first is None else first), whole, tokens


def run_level(client: openai.OpenAI, model: str, clients: int, per_client: int, max_tokens: int) -> dict:
    def client_loop(c: int) -> list[tuple[float, float, int]]:
        return [one_request(client, model, QUESTIONS[(c * per_client + k) % len(QUESTIONS)], max_tokens)
                for k in range(per_client)]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client_loop, range(clients), timeout=REQUEST_TIMEOUT_S * per_client)
                   for r in rs]
    wall = time.perf_counter() - started
    ttft = sorted(r[0] for r in results)
    return {"clients": clients, "requests": len(results), "wall_s": wall, "requests_per_s": len(results) / wall,
            "ttft_median_s": statistics.median(ttft), "ttft_p90_s": ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))],
            "latency_median_s": statistics.median(r[1] for r in results),
            "tokens_per_s": sum(r[2] for r in results) / wall, "tokens": sum(r[2] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path")
    parser.add_argument("--adapter_name_or_path")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests_per_client", type=int, default=3)
    parser.add_argument("--max_tokens", type=int, default=64)
    args = parser.parse_args()
    if args.adapter_name_or_path is None and args.model_name_or_path is None \
            and (ROOT / "outputs" / "sft_demo" / "adapter_config.json").is_file():
        args.adapter_name_or_path = str(ROOT / "outputs" / "sft_demo")

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        proc, url = start_server(args, log)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
            model = client.models.list().data[0].id
            one_request(client, model, "Hello!", 8)  # warm-up, not timed
            print(f"serving {model}; {args.requests_per_client} streamed requests per client, max_tokens "
                  f"{args.max_tokens}, greedy\n")
            print(f"{'clients':>7} {'requests':>8} {'wall s':>7} {'req/s':>6} {'TTFT med s':>10} {'TTFT p90 s':>10} "
                  f"{'latency med s':>13} {'tokens/s':>8}")
            for clients in args.clients:
                r = run_level(client, model, clients, args.requests_per_client, args.max_tokens)
                print(f"{r['clients']:>7} {r['requests']:>8} {r['wall_s']:>7.1f} {r['requests_per_s']:>6.2f} "
                      f"{r['ttft_median_s']:>10.2f} {r['ttft_p90_s']:>10.2f} {r['latency_median_s']:>13.2f} "
                      f"{r['tokens_per_s']:>8.1f}", flush=True)
            print(f"\nserver batches: {httpx.get(url + '/health').json()}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
