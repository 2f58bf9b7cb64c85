"""Size and quality of GGUF files of one model in llama.cpp (needs llama-cpp-python:
`bash scripts/setup.sh --with-llama-cpp`), against a reference file (f16):

    python -m benchmarks.gguf_quality --reference outputs/gguf/m-f16.gguf outputs/gguf/m-*.gguf

- perplexity: of every token of the held-out conversations (the first --conversations of data/demo/sft.jsonl,
  rendered with the file's chat template: text the default model never trained on), teacher-forced;
- greedy agreement: each prompt of data/demo/prompts_eval.jsonl answered greedily (--new_tokens tokens);
  the share of answers identical to the reference file's, and of tokens before the first difference.
Prints one Markdown table row per file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from benchmarks.common import ROOT
from tunesmith.data.formats import conversation_from_row, read_rows
from tunesmith.export.gguf_llama_cpp import load


def _render(llm, messages, generation_prompt: bool) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment().from_string(llm.metadata["tokenizer.chat_template"])
    return template.render(messages=messages, add_generation_prompt=generation_prompt)


def perplexity(llm, texts: list[str]) -> float:
    nll, count = 0.0, 0
    for text in texts:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids) - 1], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
        count += len(ids) - 1
    return math.exp(nll / count)


def greedy(llm, prompts: list[str], new_tokens: int) -> list[list[int]]:
    answers = []
    for prompt in prompts:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.reset()
        out = []
        for _ in range(new_tokens):
            llm.eval((ids + out)[llm.n_tokens:])
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            if out[-1] == llm.token_eos():
                break
        answers.append(out)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--reference", required=True)
    parser.add_argument("--conversations", type=int, default=60)
    parser.add_argument("--new_tokens", type=int, default=48)
    args = parser.parse_args()
    rows = [r for r in read_rows(os.path.join(ROOT, "data/demo/sft.jsonl"))][: args.conversations]
    conversations = [conversation_from_row(r).messages for r in rows]
    prompt_rows = [json.loads(line) for line in open(os.path.join(ROOT, "data/demo/prompts_eval.jsonl"))]
    prompt_messages = [r.get("messages") or [{"role": "user", "content": r["prompt"]}] for r in prompt_rows]

    reference = None
    print("| file | dtype | size | perplexity | same answer as the reference | same tokens before the first difference | "
          "seconds |")
    print("|---|---|---|---|---|---|---|")
    for path in [args.reference] + [f for f in args.files if f != args.reference]:
        started = time.perf_counter()
        llm = load(path, n_ctx=2048)
        texts = [_render(llm, m, False) for m in conversations]
        prompts = [_render(llm, m, True) for m in prompt_messages]
        ppl = perplexity(llm, texts)
        answers = greedy(llm, prompts, args.new_tokens)
        llm.close()
        if reference is None:
            reference = answers
        same = sum(a == b for a, b in zip(answers, reference)) / len(answers)
        prefix = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                     for a, b in zip(answers, reference)) / sum(len(b) for b in reference)
        dtype = os.path.basename(path).rsplit("-", 1)[-1].removesuffix(".gguf")
        print(f"| {os.path.basename(path)} | {dtype} | {os.path.getsize(path) / 2**20:.1f} MiB | {ppl:.3f} | "
              f"{same:.0%} | {prefix:.1%} | {time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
