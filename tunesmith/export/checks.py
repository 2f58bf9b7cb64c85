"""The checks an exported GGUF goes through before it gets its name, shared by the text export (export.py) and
the vision-language one (vision_export.py): the conversations rendered with the training template and the source's
answers to them (text_references), transformers' read-back and llama.cpp's verdicts on a text GGUF (check_text_gguf),
the scratch files they are written to and their publishing under their names, the Ollama Modelfile, and the lines
that report them."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import ASSISTANT, SYSTEM, USER
from ..data.formats import Message
from ..data.template import render_text
from ..utils.events import report_warning
from ..utils.io import atomic_write_text
from .gguf_arch import Architecture
from .gguf_llama_cpp import SETUP_HINT, LlamaCppCheck, check_in_llama_cpp, greedy_references
from .gguf_model import RoundTrip, compare_round_trip, source_logits
from .ollama import OllamaChat, modelfile_text, ollama_parameters

logger = logging.getLogger(__name__)

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


@dataclass
class TextReferences:
    """What the source model says, for the checks of a text GGUF written from it: the rendered check conversations,
    its logits on them, and (where llama.cpp will check the file) its greedy continuations of the check prompts."""

    texts: list[str]
    expected: Any
    greedy: list


def text_references(model: Any, tokenizer: Any, in_llama_cpp: bool) -> TextReferences:
    texts = check_texts(tokenizer)
    greedy = greedy_references(model, tokenizer, check_prompts(tokenizer), GREEDY_NEW_TOKENS) if in_llama_cpp else []
    return TextReferences(texts, source_logits(model, tokenizer, texts), greedy)


@dataclass
class TextChecks:
    round_trip: RoundTrip | None  # transformers' read-back; None where its loader cannot rebuild the file
    why_not_read_back: str
    llama_cpp: LlamaCppCheck | None
    problem: str | None  # the first refusal, None when the file may get its name


def check_text_gguf(spec: Architecture, path: str, tokenizer: Any, refs: TextReferences, tolerance: float,
                    in_llama_cpp: bool, greedy_must_match: bool) -> TextChecks:
    """A written text GGUF read back with transformers' GGUF loader (where it rebuilds the architecture), then in
    llama.cpp (where llama-cpp-python is installed), stopping at the first refusal."""
    check, why_not = read_back(spec, path, tokenizer, refs.texts, refs.expected)
    if check and check.token_mismatch and in_llama_cpp:
        # transformers rebuilds a tokenizer from the file in its own way (it drops the ▁ that a SentencePiece-style
        # tokenizer puts after special tokens, for one): llama.cpp, which reads the file as it is meant to be read,
        # decides on tokens below.
        report_warning(logger, "transformers' GGUF tokenizer encodes %s; checking tokens in llama.cpp", check.token_mismatch)
    problem = read_back_refusal(check, tolerance, tokens_checked_elsewhere=in_llama_cpp) if check else None
    in_llama = None
    if not problem and in_llama_cpp:
        in_llama = check_in_llama_cpp(path, tokenizer, refs.texts, refs.greedy)
        problem = llama_cpp_refusal(in_llama, greedy_must_match=greedy_must_match)
    return TextChecks(check, why_not, in_llama, problem)


def publish(scratch_path: str, target: Path) -> None:
    """A checked scratch file under its name, readable by all: mkstemp's 0600 would keep Ollama's server (its own
    user on Linux) out."""
    os.replace(scratch_path, target)
    os.chmod(target, 0o644)


def write_modelfile(path: str, gguf_name: str, chat: OllamaChat | None, source: str, model_name_or_path: str | None,
                    adapter_name_or_path: str | None, projector_name: str | None = None) -> str | None:
    """The Ollama Modelfile beside the GGUF (its path), or None where the chat template has no Ollama form: an old
    Modelfile there is removed, since it would describe another template."""
    if chat is None:
        Path(path).unlink(missing_ok=True)
        return None
    parameters = ollama_parameters(model_name_or_path, adapter_name_or_path)
    atomic_write_text(path, modelfile_text(gguf_name, chat, source, parameters, projector_name=projector_name))
    os.chmod(path, 0o644)
    return path


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
