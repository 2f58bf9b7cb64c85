"""The checks an exported GGUF goes through before it gets its name, shared by the text export (export.py) and
the vision-language one (export_vision.py): the conversations rendered with the training template, transformers'
read-back and llama.cpp's verdicts on them, the scratch files they are written to, and the lines that report them."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..constants import ASSISTANT, SYSTEM, USER
from ..data.formats import Message
from ..data.template import render_text
from ..models.gguf_arch import Architecture
from ..models.gguf_export import RoundTrip, compare_round_trip
from ..models.gguf_llama_cpp import SETUP_HINT, LlamaCppCheck

# What the check renders and compares: a one-word answer, a system prompt and several turns, Chinese (as
# in the demo data), digits and code (where tokenizers' pre-splitting differs most).
CHECK_CONVERSATIONS: list[list[Message]] = [
    [{"role": USER, "content": "What is the capital of France? Answer in one word."},
     {"role": ASSISTANT, "content": "Paris."}],
    [{"role": SYSTEM, "content": "You are a concise assistant."}, {"role": USER, "content": "Who are you?"},
     {"role": ASSISTANT, "content": "A small language model, fine-tuned with tunesmith."},
     {"role": USER, "content": "Count from 1 to 12, then add 2024 + 365."}],
    [{"role": USER, "content": "用一句话介绍你自己。"}, {"role": ASSISTANT, "content": "我是一个乐于助人的助手。"}],
    [{"role": USER, "content": "Write a Python function that adds two numbers."},
     {"role": ASSISTANT, "content": "def add(a, b):\n    return a + b  # 3.14 + 2.71\n"}],
]
RUN_CONFIG_KEY = "tunesmith.run_config"
GREEDY_NEW_TOKENS = 16  # per prompt, for the greedy comparison in llama.cpp


def read_back_refusal(check: RoundTrip, tolerance: float, tokens_checked_elsewhere: bool = False) -> str | None:
    if check.token_mismatch and not tokens_checked_elsewhere:
        return f"its tokenizer encodes {check.token_mismatch}"
    if not check.template_equal:
        return "its chat template differs from the one the model was trained with"
    if not check.relative_diff <= tolerance:
        return (f"max |logit difference| {check.max_abs_diff:.3g} is {check.relative_diff:.3g} of the largest |logit| "
                f"({check.logit_scale:.3g}), above the bound {tolerance:g}")
    return None


def llama_cpp_refusal(check: LlamaCppCheck, greedy_must_match: bool) -> str | None:
    if check.token_mismatch:
        return f"llama.cpp {check.version} tokenizes {check.token_mismatch}"
    if not check.template_equal:
        return f"llama.cpp {check.version} reads a chat template other than the training one"
    if greedy_must_match and check.decisive_disagreements:
        return (f"llama.cpp's greedy continuation leaves transformers' at {check.decisive_disagreements} of "
                f"{check.greedy_steps} steps ({check.first_disagreement})")
    return None


def read_back(spec: Architecture, path: str, tokenizer, texts: list[str], expected) -> tuple[RoundTrip | None, str]:
    """(transformers' read-back check, "") where its GGUF loader rebuilds the architecture; (None, why) where it
    cannot (the file is then checked in llama.cpp only, or not at all)."""
    if not spec.transformers_reads_back:
        return None, f"it does not rebuild {spec.name} with every setting in the file"
    try:
        return compare_round_trip(path, tokenizer, texts, expected), ""
    except (RuntimeError, ValueError, NotImplementedError, KeyError) as error:  # its loader's refusals
        return None, f"it cannot read this file back ({str(error).splitlines()[0][:200]})"


UNCHECKED_HINT = f"{SETUP_HINT}; --require_llama_cpp_check makes this an error"


def check_texts(tokenizer) -> list[str]:
    """The check conversations rendered with the training template (a generation prompt after a user turn)."""
    return [render_text(tokenizer, c, add_generation_prompt=c[-1]["role"] != ASSISTANT) for c in CHECK_CONVERSATIONS]


@contextlib.contextmanager
def scratch_files(target: Path) -> Iterator[Callable[[str], str]]:
    """new(tag): an empty temporary .gguf beside `target` (hidden, so nothing picks up a file before its
    check); every one left at the end of the block is deleted, whether the block succeeded or not."""
    made: list[str] = []

    def new(tag: str = "") -> str:
        fd, path = tempfile.mkstemp(prefix=f".{target.stem}.{tag}", suffix=".gguf", dir=target.parent)
        os.close(fd)
        made.append(path)
        return path

    try:
        yield new
    finally:
        for path in made:
            Path(path).unlink(missing_ok=True)


def check_prompts(tokenizer) -> list[str]:
    """Each check conversation up to its last user turn, rendered with the generation prompt."""
    prompts = []
    for conversation in CHECK_CONVERSATIONS:
        last_user = max(i for i, m in enumerate(conversation) if m["role"] == USER)
        prompts.append(render_text(tokenizer, conversation[: last_user + 1], add_generation_prompt=True))
    return prompts


def llama_cpp_line(c: LlamaCppCheck, what: str) -> str:
    ties = f", {c.greedy_ties} near-ties" if c.greedy_ties else ""
    return (f"in llama.cpp {c.version} ({what}): tokens and chat template identical; greedy next token as transformers' "
            f"at {c.greedy_agree}/{c.greedy_steps} steps{ties}; max |logit difference| {c.max_abs_diff:.3g} "
            f"(largest |logit| {c.logit_scale:.3g})")


def read_back_summary(r: Any) -> str:
    """The read-back check of an export result (ExportResult, VisionExportResult), in one line."""
    c = r.round_trip
    if c is None:
        return "NOT CHECKED (see the warning above)" if r.llama_cpp is None else f"checked in {r.check_seconds:.1f} s"
    tokens = ("chat template identical, tokenizer ids differ in transformers' own GGUF tokenizer (see llama.cpp's)"
              if c.token_mismatch else "tokenizer ids and chat template identical")
    return (f"checked in {r.check_seconds:.1f} s: read back with transformers, max |logit difference| vs the source = "
            f"{c.max_abs_diff:.3g} ({c.relative_diff:.2e} of the largest |logit| {c.logit_scale:.3g}; bound "
            f"{r.tolerance:g}), same next token at {c.top1_agreement:.1%} of positions; {tokens}")
