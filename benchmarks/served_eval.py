"""lm-eval through the server against lm-eval in process, on any model or adapter: the same tasks run with
lm-eval's `local-completions` model against `chat/serve.py` (float32, so the two compute alike) and with
lm-eval's `hf` model (an adapter through its `peft=` argument); prints each task's metric both ways and how
far the per-choice log-likelihoods and the generated answers differ.

    .venv/bin/python -m benchmarks.served_eval --adapter_name_or_path outputs/sft_demo
    .venv/bin/python -m benchmarks.served_eval --model_name_or_path M --tasks my_task \\
        --include_path my_tasks/

Default tasks: the 20-question multiple-choice and generation tasks the tests ship
(tests/data/lm_eval_tasks/). Nothing is downloaded: the tasks, model and tokenizer are local.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.serve import free_port, start_server

TASKS = ROOT / "tests" / "data" / "lm_eval_tasks"


def serve(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    """chat/serve.py on a free port, in float32 as lm-eval's hf model computes; (process, address)."""
    port = free_port()
    command = [sys.executable, str(ROOT / "chat" / "serve.py"), "--port", str(port), "--dtype", "float32",
               "--served_model_name", "served", "--do_sample", "false"]
    if args.model_name_or_path:
        command += ["--model_name_or_path", args.model_name_or_path]
    if args.adapter_name_or_path:
        command += ["--adapter_name_or_path", args.adapter_name_or_path]
    url = f"http://127.0.0.1:{port}"
    return start_server(command, url, log), url


def evaluate(model: str, model_args: str, tasks: list[str], include_path: str) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, log_samples=True,
                                   task_manager=TaskManager(include_path=include_path))


def responses(result: dict, task: str) -> list:
    return [s["filtered_resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", help="A model folder (default: the adapter's base, else the embedded model).")
    parser.add_argument("--adapter_name_or_path")
    parser.add_argument("--tasks", nargs="+", default=["tunesmith_tiny_mc", "tunesmith_tiny_gen"])
    parser.add_argument("--include_path", default=str(TASKS))
    args = parser.parse_args()
    from tunesmith.models.default_model import ensure_default_model
    from tunesmith.utils.paths import adapter_base_model, is_adapter_dir, problem_with_model_dir

    if args.adapter_name_or_path and not is_adapter_dir(args.adapter_name_or_path):
        raise SystemExit(f"benchmarks.served_eval: --adapter_name_or_path {args.adapter_name_or_path}: not a LoRA adapter "
                         "folder (no adapter_config.json); give one that training wrote")
    problem = args.model_name_or_path and problem_with_model_dir(args.model_name_or_path)
    if problem:
        raise SystemExit(f"benchmarks.served_eval: --model_name_or_path {args.model_name_or_path}: {problem}")

    base = args.model_name_or_path or (adapter_base_model(args.adapter_name_or_path) if args.adapter_name_or_path
                                       else str(ensure_default_model()))
    tokenizer = args.adapter_name_or_path or base
    hf_args = f"pretrained={base},dtype=float32,device=cpu,batch_size=1"
    if args.adapter_name_or_path:
        hf_args += f",peft={args.adapter_name_or_path}"
    os.chdir(ROOT)  # the shipped tasks' data_files are relative to the repository root
    local = evaluate("hf", hf_args, args.tasks, args.include_path)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(args, Path(tmp) / "server.log")
        try:
            remote = evaluate("local-completions", f"model=served,base_url={url}/v1/completions,tokenizer={tokenizer},"
                              "tokenized_requests=True,num_concurrent=1,max_retries=1,batch_size=4",
                              args.tasks, args.include_path)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    for task in args.tasks:
        metrics = {k: v for k, v in local["results"][task].items() if "," in k and "stderr" not in k}
        both = ", ".join(f"{k}: in-process {v} / served {remote['results'][task][k]}" for k, v in metrics.items())
        mine, theirs = responses(remote, task), responses(local, task)
        if mine and isinstance(mine[0][0], (list, tuple)):  # loglikelihood: (ll, is_greedy) per choice
            gap = max(abs(a[0] - b[0]) for m, t in zip(mine, theirs) for a, b in zip(m, t))
            same = sum(a[1] == b[1] for m, t in zip(mine, theirs) for a, b in zip(m, t))
            total = sum(len(m) for m in mine)
            print(f"{task}: {both}; max |log-likelihood difference| {gap:.2e} over {total} choices, "
                  f"is-greedy equal on {same}/{total}")
        else:
            same = sum(m == t for m, t in zip(mine, theirs))
            print(f"{task}: {both}; identical answers {same}/{len(mine)}")


if __name__ == "__main__":
    main()
