"""A text GGUF and its mmproj file checked together in real llama.cpp's multimodal library (mtmd, through
llama-cpp-python built with it: `bash scripts/setup.sh --with-llama-cpp`), against transformers on one picture:

- the picture's embeddings: llama.cpp's preprocessing, tower and projector (mtmd_encode_chunk,
  mtmd_get_output_embd) against transformers' own image features (get_image_features) for the same file;
- the prompt's layout: the text tokens and the number of image tokens llama.cpp puts around the picture must be
  transformers' processor's, in the same order (otherwise the two models see different prompts);
- the reply: transformers' greedy reply to the picture is fed to llama.cpp (which sees the picture through the
  mmproj file, with M-RoPE positions for Qwen2-VL), and llama.cpp must pick the same next token at every step
  (a step whose top two transformers logits are closer than the two engines' logit difference there is a tie,
  counted apart, as the text check does); the logits are compared too.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ExportError
from .gguf_llama_cpp import _quiet_stderr, llama_cpp_version, load

# Where the chat template puts a picture (before the processor expands it), and what replaces it in the prompt
# llama.cpp reads: mtmd's media marker, around which mtmd itself writes the family's begin/end tokens.
PLACEHOLDERS = {
    "qwen2_vl": ("<|vision_start|><|image_pad|><|vision_end|>", "{marker}"),  # mtmd adds vision_start/end
    "qwen2_5_vl": ("<|vision_start|><|image_pad|><|vision_end|>", "{marker}"),
    "gemma3": ("<start_of_image>", "\n\n{marker}\n\n"),  # transformers' processor adds the blank lines around it
    "idefics3": ("<image>", "{marker}"),
}
# transformers' forward inputs that carry pictures (get_image_features takes these)
_IMAGE_INPUTS = ("pixel_values", "image_grid_thw", "pixel_attention_mask")


def mtmd_available() -> bool:
    """llama-cpp-python with its multimodal library: the Python module loads the shared library on import, which a
    build with -DLLAVA_BUILD=OFF does not have."""
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401
    except (ImportError, OSError, RuntimeError, FileNotFoundError):
        return False
    return True


def mtmd_library_found() -> bool:
    """llama-cpp-python with its multimodal library beside it (built with -DLLAVA_BUILD=ON), found without
    loading it: what the flags are checked against (rules.py, export_llama_cpp_mtmd_check) before anything loads."""
    spec = importlib.util.find_spec("llama_cpp")
    return bool(spec and spec.origin and any(Path(spec.origin).parent.glob("lib/*mtmd*")))


@dataclass
class ImageCheck:
    version: str
    image_tokens: int  # llama.cpp's embeddings for the picture (rows)
    layout_equal: bool  # the same text tokens and image tokens, in the same order, as transformers' processor
    layout_difference: str | None
    embd_max_abs_diff: float  # llama.cpp's image embeddings against transformers' image features
    embd_scale: float  # transformers' largest |feature|
    steps: int  # reply steps compared
    agree: int
    ties: int
    logit_max_abs_diff: float
    logit_scale: float
    first_disagreement: str | None = None

    @property
    def decisive_disagreements(self) -> int:
        return self.steps - self.agree - self.ties

    @property
    def embd_relative_diff(self) -> float:
        return self.embd_max_abs_diff / max(self.embd_scale, 1e-12)


def image_features(model: Any, vision: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' image features for the pictures in `vision` (what replaces the image tokens), one row per
    image token, all pictures in order."""
    inputs = {k: v.to(model.device) for k, v in vision.items() if k in _IMAGE_INPUTS}
    with torch.no_grad():
        out = model.model.get_image_features(**inputs)
    out = getattr(out, "pooler_output", out)
    parts = list(out) if isinstance(out, list | tuple) else [out]
    return torch.cat([p.reshape(-1, p.shape[-1]) for p in parts]).float().cpu()


def llama_cpp_prompt(model_type: str, rendered: str, marker: str) -> str:
    """The rendered conversation with the picture's placeholder replaced as llama.cpp's mtmd expects it."""
    placeholder, replacement = PLACEHOLDERS[model_type]
    if placeholder not in rendered:
        raise ExportError(f"the chat template's rendering has no {placeholder!r} where the picture goes")
    return rendered.replace(placeholder, replacement.format(marker=marker), 1)


def _layout_difference(want: list[int], got: list[int]) -> str | None:
    """None when equal; else where they part (image tokens as -1)."""
    if want == got:
        return None
    at = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
    return (f"from token {at}: {want[at:at + 4]} in transformers, {got[at:at + 4]} in llama.cpp (-1: image) "
            f"of {len(want)} and {len(got)}")


def check_image_in_llama_cpp(text_path: str, mmproj_path: str, model: Any, tokenizer: Any, rendered: str,
                             image_token_id: int, prompt_ids: list[int], vision: dict[str, torch.Tensor],
                             picture: Any, reply: list[int], reply_logits: torch.Tensor) -> ImageCheck:
    """Load the text GGUF and its mmproj in llama.cpp, show it `picture` (a PIL image, the one transformers' `vision`
    inputs come from) within `rendered` (the conversation as the chat template renders it) and compare: image
    embeddings with transformers' features, the prompt's layout with `prompt_ids`, and the next-token logits along
    transformers' greedy `reply` (its logits `reply_logits`, one row per reply token)."""
    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    n_ctx = len(prompt_ids) + len(reply) + 16
    llm = load(text_path, n_ctx=n_ctx, logits_all=False)
    ctx = chunks = bitmap = None
    try:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.print_timings, params.warmup = False, False, False
        params.n_threads = llm.n_threads
        with _quiet_stderr():
            ctx = mtmd.mtmd_init_from_file(mmproj_path.encode(), llm.model, params)
        if not ctx:
            raise ExportError(f"llama.cpp {llama_cpp_version()} cannot load the mmproj file {mmproj_path} with "
                              f"{text_path}")
        rgb = picture.convert("RGB")
        data = rgb.tobytes()
        bitmap = mtmd.mtmd_bitmap_init(rgb.width, rgb.height, (ctypes.c_uint8 * len(data)).from_buffer_copy(data))
        text = mtmd.mtmd_input_text()
        prompt = llama_cpp_prompt(model.config.model_type, rendered, mtmd.mtmd_default_marker().decode())
        text.text, text.add_special, text.parse_special = prompt.encode(), False, True
        text.text_len = len(text.text)
        chunks = mtmd.mtmd_input_chunks_init()
        with _quiet_stderr():
            status = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
        if status != 0:
            raise ExportError(f"llama.cpp's mtmd_tokenize failed ({status}) on the check's picture")
        layout, embeddings = [], []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                layout += [tokens[k] for k in range(count.value)]
                continue
            layout += [-1] * n
            with _quiet_stderr():
                if mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
                    raise ExportError("llama.cpp's mtmd_encode_chunk failed on the check's picture")
            width = llm.n_embd()  # mtmd's embeddings are the text model's input rows
            out = mtmd.mtmd_get_output_embd(ctx)
            embeddings.append(np.ctypeslib.as_array(out, shape=(n * width,)).reshape(n, width).copy())
        got_embd = torch.from_numpy(np.concatenate(embeddings))
        want_embd = image_features(model, vision)
        if got_embd.shape != want_embd.shape:
            raise ExportError(f"llama.cpp makes {tuple(got_embd.shape)} image embeddings of the check's picture, "
                              f"transformers {tuple(want_embd.shape)}")
        want_layout = [-1 if t == image_token_id else t for t in prompt_ids]
        difference = _layout_difference(want_layout, layout)

        # the prompt with the picture, then transformers' reply one token at a time (teacher-forced)
        n_past = llama_cpp.llama_pos(0)
        with _quiet_stderr():
            status = mtmd.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past))
        if status != 0:
            raise ExportError(f"llama.cpp's mtmd_helper_eval_chunks failed ({status})")
        vocab = reply_logits.shape[1]
        rows = []
        for step in range(len(reply)):
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
                        [:vocab].copy())
            if step + 1 < len(reply):
                token = (llama_cpp.llama_token * 1)(reply[step])
                if llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
                    raise ExportError("llama.cpp's llama_decode failed on the reply")
        got = torch.from_numpy(np.stack(rows))
        return _compare(got, reply_logits, reply, got_embd, want_embd, difference)
    finally:
        if chunks:
            mtmd.mtmd_input_chunks_free(chunks)
        if bitmap:
            mtmd.mtmd_bitmap_free(bitmap)
        if ctx:
            mtmd.mtmd_free(ctx)
        llm.close()


def _compare(got: torch.Tensor, want: torch.Tensor, reply: list[int], got_embd: torch.Tensor,
             want_embd: torch.Tensor, layout_difference: str | None) -> ImageCheck:
    diff = (got - want).abs()
    top2 = want.topk(2, dim=-1).values
    agree = ties = 0
    first = None
    for i, token in enumerate(reply):
        if got[i].argmax().item() == token:
            agree += 1
        elif (top2[i, 0] - top2[i, 1]).item() <= 2 * diff[i].max().item():
            ties += 1
        elif first is None:
            first = f"step {i + 1}: llama.cpp chose {got[i].argmax().item()}, transformers {token}"
    return ImageCheck(llama_cpp_version(), got_embd.shape[0], layout_difference is None, layout_difference,
                      (got_embd - want_embd).abs().max().item(), want_embd.abs().max().item(), len(reply), agree,
                      ties, diff.max().item(), want.abs().max().item(), first)


def greedy_reply(model: Any, prompt_ids: list[int], vision: dict[str, torch.Tensor], new_tokens: int
                 ) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy reply to a prompt with pictures, through its end-of-turn token, and the logits at each
    step: the argmax of the model's own forward pass over the whole sequence at every step (no cache, so none
    of generate()'s position bookkeeping is redone here; the check's prompts are a few dozen tokens). Inputs
    with one value per token (token_type_ids, mm_token_type_ids) mark the reply's tokens as text (0)."""
    stop = model.generation_config.eos_token_id
    stop = set(stop if isinstance(stop, list) else [] if stop is None else [stop])
    ids, rows = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(new_tokens):
            input_ids = torch.tensor([ids], device=model.device)
            per_token = {k: torch.nn.functional.pad(v, (0, len(ids) - v.shape[-1]))
                         for k, v in vision.items() if v.dim() == 2 and v.shape[-1] == len(prompt_ids)}
            inputs = {k: v.to(model.device) for k, v in {**vision, **per_token}.items()}
            logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **inputs).logits[0, -1]
            rows.append(logits.float().cpu())
            ids.append(int(rows[-1].argmax()))
            if ids[-1] in stop:
                break
    return ids[len(prompt_ids):], torch.stack(rows)
