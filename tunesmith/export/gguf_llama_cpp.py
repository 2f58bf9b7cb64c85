"""A GGUF checked in real llama.cpp (through llama-cpp-python, an optional extra:
`bash scripts/setup.sh --with-llama-cpp`), and llama.cpp's own quantizer for the k-quants.

The check loads the file as llama.cpp does and compares it with the source model in transformers:
- tokenization: the ids of a sample (the chat-rendered check conversations, special tokens parsed, and
  plain text with CJK, emoji, digits and code), with and without the file's BOS/EOS rule;
- the chat template in `tokenizer.chat_template`, character for character;
- greedy continuation: transformers' greedy continuation of a few prompts is fed to llama.cpp, which must
  pick the same next token at every step (a step whose top two transformers logits are closer than the
  two engines' logit difference there is a tie, counted apart); the logits are compared too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import ExportError
from ..models.kv_cache import empty_cache
from ..utils.threads import usable_cores
from .gguf_vocab import CHECK_TEXT

SETUP_HINT = "bash scripts/setup.sh --with-llama-cpp"
# Plain text the tokenizers must split alike, beside the rendered conversations: llama.cpp's own probe of
# pre-tokenizers (whitespace runs, emoji, digit runs, Khmer, CJK, Cyrillic, contractions) and a few more.
TOKEN_SAMPLES = [CHECK_TEXT, "Hello world! 你好，世界。こんにちは 🙂🚀 👩‍💻 naïve café 2024-11-25 3.14159 x+=1;\n\n\tdef f():",
                 "  leading spaces, trailing tabs\t\t\nand <|im_start|> written as text"]


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


@dataclass
class GreedyReference:
    """transformers' greedy continuation of one prompt: all ids, the prompt's length, logits at each
    position from the last prompt token on (each predicts the next id)."""

    ids: list[int]
    prompt_length: int
    logits: torch.Tensor  # (len(ids) - prompt_length, vocab)


def greedy_references(model: Any, tokenizer: Any, prompts: list[str], new_tokens: int) -> list[GreedyReference]:
    """Greedy continuations by plain forward passes (argmax, through end-of-turn tokens too: both engines
    are compared on the same fixed number of steps)."""
    refs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            full, step, rows = list(ids), ids, []
            cache = empty_cache(model)  # filled in place
            for _ in range(new_tokens):
                out = model(input_ids=torch.tensor([step], device=model.device), use_cache=True, **cache)
                logits = out.logits[0, -1].float().cpu()
                rows.append(logits)
                full.append(int(logits.argmax()))
                step = full[-1:]
            refs.append(GreedyReference(full, len(ids), torch.stack(rows)))
    return refs


@dataclass
class LlamaCppCheck:
    version: str
    token_mismatch: str | None
    template_equal: bool
    greedy_steps: int  # steps compared
    greedy_agree: int  # steps where llama.cpp's next token is transformers'
    greedy_ties: int  # disagreements where transformers' top two are within the logit difference there
    max_abs_diff: float  # over every compared position
    logit_scale: float
    first_disagreement: str | None = None
    continuations: list[str] = field(default_factory=list)  # llama.cpp's free-running greedy answers

    @property
    def decisive_disagreements(self) -> int:
        return self.greedy_steps - self.greedy_agree - self.greedy_ties


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp logs on fd 2 from C, and through llama-cpp-python's callback on sys.stderr; keep both out of
    the export's output."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            with contextlib.redirect_stderr(null):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def load(path: str, n_ctx: int = 512, logits_all: bool = True, lora_path: str | None = None) -> Any:
    import llama_cpp

    # torch's thread count (OMP_NUM_THREADS) within the usable cores: ggml's threads spin at barriers, so
    # more threads than free cores makes it many times slower on a shared machine.
    threads = max(1, min(torch.get_num_threads(), usable_cores()))
    with _quiet_stderr():
        try:
            return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, logits_all=logits_all, verbose=False, seed=0,
                                   n_threads=threads, n_threads_batch=threads, lora_path=lora_path)
        except ValueError as error:  # its log, on the silenced stderr, says why
            raise ExportError(f"llama.cpp {llama_cpp.__version__} cannot load {path} ({error}); see why with "
                              f"llama_cpp.Llama(model_path=..., verbose=True)") from error


def _first_token_difference(llm: Any, tokenizer: Any, texts: list[str]) -> str | None:
    for k, text in enumerate(texts):
        for special in (False, True):
            want = tokenizer(text, add_special_tokens=special)["input_ids"]
            got = llm.tokenize(text.encode("utf-8"), add_bos=special, special=True)
            if got != want:
                at = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
                return (f"sample {k + 1} (add_special_tokens={special}) from token {at}: {want[at:at + 3]} in "
                        f"transformers, {got[at:at + 3]} in llama.cpp")
    return None


def check_in_llama_cpp(path: str, tokenizer: Any, texts: list[str], refs: list[GreedyReference],
                       lora_path: str | None = None) -> LlamaCppCheck:
    """Load `path` (with the adapter GGUF `lora_path` over it) in llama.cpp and compare tokens (on `texts` and
    TOKEN_SAMPLES), chat template and greedy continuations (`refs`, from transformers) with the source."""
    n_ctx = max([len(r.ids) for r in refs] + [len(tokenizer(t)["input_ids"]) for t in texts]) + 16
    llm = load(path, n_ctx=n_ctx, lora_path=lora_path)
    try:
        mismatch = _first_token_difference(llm, tokenizer, texts + TOKEN_SAMPLES)
        template_equal = llm.metadata.get("tokenizer.chat_template") == tokenizer.chat_template
        steps = agree = ties = 0
        max_diff = scale = 0.0
        first = None
        for k, ref in enumerate(refs):
            llm.reset()
            llm.eval(ref.ids[:-1])
            got = torch.from_numpy(np.array(llm.scores[ref.prompt_length - 1: len(ref.ids) - 1], dtype=np.float32))
            want = ref.logits[:, : got.shape[1]]
            diff = (got - want).abs()
            max_diff, scale = max(max_diff, diff.max().item()), max(scale, want.abs().max().item())
            top2 = want.topk(2, dim=-1).values
            for i in range(want.shape[0]):
                steps += 1
                if got[i].argmax().item() == ref.ids[ref.prompt_length + i]:
                    agree += 1
                elif (top2[i, 0] - top2[i, 1]).item() <= 2 * diff[i].max().item():
                    ties += 1
                elif first is None:
                    first = (f"prompt {k + 1}, step {i + 1}: llama.cpp chose {got[i].argmax().item()}, transformers "
                             f"{ref.ids[ref.prompt_length + i]}")
        continuations = []
        for ref in refs:
            llm.reset()
            ids = list(ref.ids[: ref.prompt_length])
            for _ in range(len(ref.ids) - ref.prompt_length):
                llm.eval(ids[llm.n_tokens:])
                ids.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            continuations.append(ids[ref.prompt_length:])
        answers = [tokenizer.decode(c) for c in continuations]
        return LlamaCppCheck(llama_cpp_version(), mismatch, template_equal, steps, agree, ties, max_diff, scale,
                             first, answers)
    finally:
        llm.close()


def quantize(source: str, target: str, dtype: str) -> None:
    """llama.cpp's quantizer (llama_model_quantize, the C API that llama-quantize calls) from an f16 GGUF. Its
    absence is refused with the flags (rules.py, export_k_quant), before anything loads."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{dtype.upper()}")  # rules.K_QUANTS: q4_k_m ...
    params.nthread = os.cpu_count() or 1
    with _quiet_stderr():
        status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
    if status != 0:
        raise ExportError(f"llama.cpp's quantizer failed ({status}) making {dtype} from {source}")
