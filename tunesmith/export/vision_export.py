"""`tunesmith export` of a vision-language model (Qwen2-VL, Gemma 3): its language model as the
--output_file GGUF and its vision tower + projector as llama.cpp's mmproj file beside it (mmproj-<name>.gguf; see
gguf_vision), both checked before either gets its name:

- the text GGUF as a text model's (command.py) in llama.cpp: the tokens, the chat template and greedy
  continuations of the check conversations, text only (transformers' GGUF loader has no qwen2vl, and drops Gemma 3's
  settings);
- the pair in llama.cpp's multimodal library (mtmd; llama-cpp-python built with it), against transformers on one
  picture (gguf_mtmd): image embeddings within IMAGE_EMBD_TOLERANCES, the same prompt layout, and
  transformers' greedy reply to the picture chosen by llama.cpp at every step but near-ties.
A refused export leaves neither file. k-quants and --adapter_only are refused for these models (rules.py).
"""

from __future__ import annotations

import base64
import io
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import USER
from ..data.images import image_part
from ..data.template import encode_prompt, processor_of, render_text
from ..errors import ExportError
from ..hparams import ModelArguments
from ..utils.events import report, report_warning
from .args import ExportArguments
from .checks import (
    RUN_CONFIG_KEY,
    UNCHECKED_HINT,
    check_text_gguf,
    llama_cpp_line,
    publish,
    read_back_summary,
    scratch_files,
    text_references,
    write_modelfile,
)
from .gguf_arch import architecture
from .gguf_llama_cpp import LlamaCppCheck, llama_cpp_available
from .gguf_model import RoundTrip
from .gguf_mtmd import ImageCheck, check_image_in_llama_cpp, greedy_reply, mtmd_available
from .gguf_vision import LanguageModel, projector, write_vision_gguf
from .ollama import ollama_chat

logger = logging.getLogger(__name__)
REPLY_TOKENS = 12  # transformers' greedy reply to the check picture, fed to llama.cpp
QUESTION = "Describe the picture in one sentence."
# Largest |image embedding difference| (llama.cpp against transformers) over the largest |feature|. Even an f32 file
# differs: ggml's conv_2d makes its im2col in f16, so the pixels enter the patch embedding rounded to 11 bits (about
# 5e-4 relative); measured 4.0e-4 (Qwen2-VL) and 6.2e-4 (Gemma 3) on the tiny test models in f32, 5.2e-4 and 4.8e-4
# in f16. The bounds leave room for real towers' depth (32 blocks, not 2); a wrong weight gives order 1.
IMAGE_EMBD_TOLERANCES = {"f32": 5e-3, "f16": 2e-2}


@dataclass
class VisionExportResult:
    output_file: str
    mmproj_file: str
    modelfile: str | None
    dtype: str
    size_bytes: int
    mmproj_bytes: int
    write_seconds: float
    check_seconds: float
    round_trip: RoundTrip | None
    llama_cpp: LlamaCppCheck | None
    image: ImageCheck | None
    tolerance: float  # the text GGUF's read-back bound (max_relative_logit_diff)
    embd_tolerance: float


# Qwen pictures both engines take without resizing: a whole number of merged patches (28 px), within transformers'
# default pixel limits and llama.cpp's 8 to 4096 tokens. Qwen2.5-VL's spans two of its 112-pixel attention windows.
QWEN_CHECK_PICTURES = {"qwen2_vl": (112, 84), "qwen2_5_vl": (224, 56)}


def check_picture(config: Any) -> Any:
    """A picture both engines take without resizing: Qwen2-VL's 112x84 (12 tokens), Qwen2.5-VL's 224x56 (16 tokens,
    two attention windows); Gemma 3's SigLIP tower takes its image_size square as it is. A red square and a blue
    disc on white."""
    from PIL import Image, ImageDraw

    width, height = QWEN_CHECK_PICTURES.get(config.model_type) or (config.vision_config.image_size,) * 2
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((width // 8, height // 8, width // 2, height // 2), fill=(220, 30, 30))
    draw.ellipse((width // 2, height // 2, 7 * width // 8, 7 * height // 8), fill=(30, 40, 220))
    return image


def _data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _image_token_id(model: Any) -> int:
    config = model.config  # the outer config: a picture's token ids are the vision-language model's, not the text's
    return getattr(config, "image_token_id", None) or config.image_token_index


def _image_refusal(check: ImageCheck, tolerance: float) -> str | None:
    if not check.layout_equal:
        return f"llama.cpp lays out the picture's prompt differently ({check.layout_difference})"
    if not check.embd_relative_diff <= tolerance:
        return (f"llama.cpp's image embeddings differ from transformers' by {check.embd_max_abs_diff:.3g} "
                f"({check.embd_relative_diff:.2e} of the largest |feature| {check.embd_scale:.3g}; bound {tolerance:g})")
    if check.decisive_disagreements:
        return (f"llama.cpp's greedy reply to the picture leaves transformers' at {check.decisive_disagreements} of "
                f"{check.steps} steps ({check.first_disagreement})")
    return None


def export_vision(model: Any, tokenizer: Any, model_args: ModelArguments, args: ExportArguments, tolerance: float,
                  source: str, record: str, started: float) -> VisionExportResult:
    """Write and check the text GGUF and the mmproj file of `model` (loaded and merged in float32)."""
    dtype = model_args.dtype
    language = LanguageModel(model)
    spec = architecture(language, args.drop_sliding_window)
    projector(model.config)
    in_llama_cpp, with_mtmd = llama_cpp_available(), mtmd_available()
    refs = text_references(model, tokenizer, in_llama_cpp)
    picture = check_picture(model.config)
    conversation = [{"role": USER, "content": [image_part(_data_url(picture)), {"type": "text", "text": QUESTION}]}]
    rendered = render_text(tokenizer, conversation, add_generation_prompt=True)
    prompt = encode_prompt(tokenizer, conversation)
    reply, reply_logits = greedy_reply(model, list(prompt), prompt.vision, REPLY_TOKENS) if with_mtmd else ([], None)
    chat, untranslatable = ollama_chat(tokenizer)

    target = Path(args.output_file).resolve()
    projector_target = Path(args.mmproj_file).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    image_check = None
    embd_tolerance = IMAGE_EMBD_TOLERANCES["f32" if dtype == "f32" else "f16"]
    with scratch_files(target) as scratch:
        tmp, tmp_projector = scratch(), scratch("mmproj.")
        write_vision_gguf(model, tokenizer, processor_of(tokenizer).image_processor, tmp, tmp_projector, dtype,
                          os.path.basename(os.path.normpath(source)), {RUN_CONFIG_KEY: record},
                          drop_sliding_window=args.drop_sliding_window)
        written = time.perf_counter()
        checks = check_text_gguf(spec, tmp, tokenizer, refs, tolerance, in_llama_cpp,
                                 greedy_must_match=dtype != "q8_0")
        problem = checks.problem
        if not problem and with_mtmd:
            image_check = check_image_in_llama_cpp(tmp, tmp_projector, model, tokenizer, rendered,
                                                   _image_token_id(model), list(prompt), prompt.vision, picture,
                                                   reply, reply_logits)
            problem = _image_refusal(image_check, embd_tolerance)
        if problem:
            raise ExportError(f"the GGUF files written from {source} ({dtype}) do not match it: {problem}; nothing "
                              f"written to {args.output_file}")
        _log_coverage(checks.why_not_read_back, in_llama_cpp, with_mtmd)
        publish(tmp, target)
        publish(tmp_projector, projector_target)
    checked = time.perf_counter()

    modelfile = write_modelfile(args.modelfile, target.name, chat, source, model_args.model_name_or_path,
                                model_args.adapter_name_or_path, projector_name=projector_target.name)
    result = VisionExportResult(str(target), str(projector_target), modelfile, dtype, target.stat().st_size,
                                projector_target.stat().st_size, written - started, checked - written,
                                checks.round_trip, checks.llama_cpp, image_check, tolerance, embd_tolerance)
    _report(result, source, untranslatable)
    return result


def _log_coverage(why_not_read_back: str, in_llama_cpp: bool, with_mtmd: bool) -> None:
    """One line for each check that could not run."""
    if why_not_read_back and not in_llama_cpp:
        report_warning(logger, "NOT CHECKED: the text GGUF is not read back with transformers' GGUF loader (%s), and not in "
                       "llama.cpp: llama-cpp-python is not installed (%s)", why_not_read_back, UNCHECKED_HINT)
    if not with_mtmd:
        report_warning(logger, "the mmproj file is NOT CHECKED: llama-cpp-python %s (%s)",
                       "was built without its multimodal library (mtmd)" if in_llama_cpp else "is not installed",
                       UNCHECKED_HINT)


def _report(r: VisionExportResult, source: str, untranslatable: str) -> None:
    report(f"exported {source} -> {r.output_file} ({r.dtype}, {r.size_bytes / 2**20:.1f} MiB) and its vision tower + "
          f"projector -> {r.mmproj_file} ({r.mmproj_bytes / 2**20:.1f} MiB) in {r.write_seconds:.1f} s; "
          + read_back_summary(r))
    if r.llama_cpp:
        report(llama_cpp_line(r.llama_cpp, "the text model, text prompts"))
    if r.image:
        c = r.image
        ties = f", {c.ties} near-ties" if c.ties else ""
        report(f"in llama.cpp {c.version} with the mmproj file, one picture ({c.image_tokens} image tokens, prompt laid "
              f"out as transformers'): image embeddings within {c.embd_max_abs_diff:.3g} ({c.embd_relative_diff:.2e} "
              f"of the largest |feature|; bound {r.embd_tolerance:g}); greedy reply as transformers' at "
              f"{c.agree}/{c.steps} steps{ties}; max |logit difference| {c.logit_max_abs_diff:.3g} (largest |logit| "
              f"{c.logit_scale:.3g})")
    mmproj = os.path.basename(r.mmproj_file)
    report(f"llama.cpp: llama-mtmd-cli -m {r.output_file} --mmproj {r.mmproj_file} (or llama-server ... --mmproj)")
    if r.modelfile:
        report(f"Ollama: ollama create NAME -f {r.modelfile} && ollama run NAME (the Modelfile's second FROM names "
              f"{mmproj}; whether Ollama's own engine runs this projector depends on its version, not checked here)")
    else:
        report(f"no Modelfile written: {untranslatable}.")
