"""Server throughput and latency: requests/s, time to first token and generated tokens/s of
`chat/serve.py` under 1, 4 and 16 concurrent clients, and with --peer transformers the same against
`transformers serve --continuous-batching` on the same model folder, prompts and greedy settings.

    .venv/bin/python -m benchmarks.serve [--model_name_or_path M] [--adapter_name_or_path A]
        [--clients 1 4 16] [--requests_per_client 3] [--max_tokens 64] [--peer transformers --repeats 3]

With --peer, both servers serve a plain model folder (default: the embedded model's; transformers serve
loads no adapter), the servers take turns for --repeats rounds (each round: one server started, warmed up,
every client count, stopped), and the table gives medians; generated tokens are counted with the model's
tokenizer on the text each server returned, so both are counted alike; peak RSS is the server process's
(VmHWM). --dtype goes to both servers: `auto` (default) compares each at its own default, `bfloat16` or
`float32` at the same precision. The last line is `req/s ratio vs transformers serve at 16 clients: X.XX`.

Starts the server (greedy, --port 0, on 127.0.0.1 only) as a subprocess, sends one warm-up request,
then for each client count runs that many threads, each sending --requests_per_client streamed
requests one after another (each a different question, so prompt lengths vary) with the `openai`
client. Time to first token: from sending a request to its first chunk with text. Every loop is
bounded in count and each request in time; the server is stopped at the end. Without
--adapter_name_or_path or --peer it serves outputs/sft_demo when the quickstart made it, else the default model.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from transformers import AutoTokenizer

from benchmarks.common import ROOT, child_env

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


def ours_command(args: argparse.Namespace, port: int) -> list[str]:
    command = [sys.executable, str(ROOT / "chat" / "serve.py"), "--port", str(port), "--do_sample", "false",
               "--max_new_tokens", str(args.max_tokens), "--max_batch_size", str(max(args.clients)), "--dtype", args.dtype]
    if args.model_name_or_path:
        command += ["--model_name_or_path", args.model_name_or_path]
    if args.adapter_name_or_path:
        command += ["--adapter_name_or_path", args.adapter_name_or_path]
    return command


def peer_command(args: argparse.Namespace, port: int) -> list[str]:
    return [str(Path(sys.executable).with_name("transformers")), "serve", "--continuous-batching", "--host",
            "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", args.dtype, args.model_name_or_path]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=child_env(HF_HUB_OFFLINE="1"), cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server stopped:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url + "/health", timeout=5).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"the server did not come up within 300 s:\n{log.read_text()[-3000:]}")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_request(client: openai.OpenAI, model: str, question: str, max_tokens: int, tokenizer) -> tuple[float, float, int]:
    """(time to first text, whole time, generated tokens) of one streamed greedy request."""
    started = time.perf_counter()
    first = None
    pieces = []
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - started
            pieces.append(chunk.choices[0].delta.content)
    whole = time.perf_counter() - started
    tokens = len(tokenizer("".join(pieces), add_special_tokens=False)["input_ids"])
    return (whole if first is None else first), whole, tokens


def run_level(client: openai.OpenAI, model: str, clients: int, per_client: int, max_tokens: int, tokenizer) -> dict:
    def client_loop(c: int) -> list[tuple[float, float, int]]:
        return [one_request(client, model, QUESTIONS[(c * per_client + k) % len(QUESTIONS)], max_tokens, tokenizer)
                for k in range(per_client)]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client_loop, range(clients), timeout=REQUEST_TIMEOUT_S * per_client)
                   for r in rs]
    wall = time.perf_counter() - started
    ttft = sorted(r[0] for r in results)
    return {"clients": clients, "requests": len(results), "wall_s": wall, "requests_per_s": len(results) / wall,
            "ttft_p50_s": statistics.median(ttft), "ttft_p95_s": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))],
            "tokens_per_s": sum(r[2] for r in results) / wall, "tokens": sum(r[2] for r in results)}


def one_round(name: str, command: list[str], url: str, args: argparse.Namespace, tokenizer, tmp: str) -> list[dict]:
    """Start one server, warm it up, run every client count, stop it; each level's numbers with the peak RSS."""
    log = Path(tmp) / f"{name}.log"
    proc = start_server(command, url, log)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
        model = client.models.list().data[0].id if name == "tunesmith" else args.model_name_or_path
        one_request(client, model, "Hello!", 8, tokenizer)  # warm-up, not timed
        levels = [run_level(client, model, c, args.requests_per_client, args.max_tokens, tokenizer)
                  for c in args.clients]
        rss = peak_rss_mb(proc.pid)
        dtype = httpx.get(url + "/health").json().get("dtype", "?") if name == "tunesmith" else args.dtype
        return [level | {"server": name, "peak_rss_mb": rss, "dtype": dtype} for level in levels]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path")
    parser.add_argument("--adapter_name_or_path")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests_per_client", type=int, default=3)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--peer", choices=["transformers"], help="Also run this server on the same work.")
    parser.add_argument("--repeats", type=int, default=1, help="Rounds of each server, interleaved; medians reported.")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="Both servers' --dtype (auto: each its own default: tunesmith bf16 where the hardware "
                        "computes it, transformers serve the weights' dtype).")
    args = parser.parse_args()
    from tunesmith.utils.paths import problem_with_model_dir

    for flag in ("model_name_or_path", "adapter_name_or_path"):
        problem = getattr(args, flag) and problem_with_model_dir(getattr(args, flag))
        if problem:
            raise SystemExit(f"benchmarks.serve: --{flag} {getattr(args, flag)}: {problem}")
    if args.peer:
        if args.adapter_name_or_path:
            raise SystemExit("--peer transformers serves a plain model folder: give --model_name_or_path, no adapter")
        args.model_name_or_path = args.model_name_or_path or _default()
    elif args.adapter_name_or_path is None and args.model_name_or_path is None \
            and (ROOT / "outputs" / "sft_demo" / "adapter_config.json").is_file():
        args.adapter_name_or_path = str(ROOT / "outputs" / "sft_demo")
    tokenizer = AutoTokenizer.from_pretrained(args.adapter_name_or_path or args.model_name_or_path or _default())

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    print(f"{args.requests_per_client} streamed requests per client, max_tokens {args.max_tokens}, greedy\n", flush=True)
    servers = [("tunesmith", ours_command)] + ([("transformers", peer_command)] if args.peer else [])
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for name, command in servers:
                port = free_port()
                for r in one_round(name, command(args, port), f"http://127.0.0.1:{port}", args, tokenizer, tmp):
                    results.append(r)
                    print(f"round {round_ + 1} {name:>12} ({r['dtype']}) clients {r['clients']:>2}: "
                          f"{r['requests_per_s']:.2f} req/s, "
                          f"{r['tokens_per_s']:.1f} tokens/s, TTFT p50 {r['ttft_p50_s']:.2f} s, peak RSS "
                          f"{r['peak_rss_mb']:.0f} MB", flush=True)
    print(f"\nmedians of {args.repeats} round(s):")
    print(f"{'server':>12} {'clients':>7} {'req/s':>6} {'tokens/s':>8} {'TTFT p50 s':>10} {'TTFT p95 s':>10} "
          f"{'peak RSS MB':>11}")
    medians = {}
    for name, _ in servers:
        for clients in args.clients:
            rows = [r for r in results if r["server"] == name and r["clients"] == clients]
            m = {k: statistics.median(r[k] for r in rows) for k in ("requests_per_s", "tokens_per_s", "ttft_p50_s",
                                                                    "ttft_p95_s", "peak_rss_mb")}
            medians[name, clients] = m
            print(f"{name:>12} {clients:>7} {m['requests_per_s']:>6.2f} {m['tokens_per_s']:>8.1f} "
                  f"{m['ttft_p50_s']:>10.2f} {m['ttft_p95_s']:>10.2f} {m['peak_rss_mb']:>11.0f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.peer:
        top = max(args.clients)
        ratio = medians["tunesmith", top]["requests_per_s"] / medians["transformers", top]["requests_per_s"]
        print(f"req/s ratio vs transformers serve at {top} clients: {ratio:.2f}")


def _default() -> str:
    from tunesmith.models.default_model import ensure_default_model

    return str(ensure_default_model())


if __name__ == "__main__":
    main()
