"""Export a model or a LoRA adapter as one GGUF file for llama.cpp and Ollama, with its tokenizer, the
chat template it was trained with and an Ollama Modelfile, checked against the source model.

    tunesmith export --model_name_or_path outputs/sft_demo --output_file outputs/sft_demo.gguf
    tunesmith export --model_name_or_path outputs/sft_demo_merged --output_file OUT.gguf --dtype q8_0
    tunesmith export --model_name_or_path outputs/sft_demo --output_file OUT.gguf --dtype q4_k_m
    tunesmith export --model_name_or_path outputs/sft_demo --output_file ADAPTER.gguf --adapter_only

--model_name_or_path is a model folder (merged, or fully fine-tuned) or an adapter folder, which is
merged into its base (the one adapter_config.json records) in memory first, or, with --adapter_only,
written alone as llama.cpp's adapter GGUF. Llama, Mistral, Qwen2, Qwen3, Gemma 2 and Gemma 3 (text)
models with a byte-level BPE or SentencePiece-style tokenizer are written; others are refused by name, and
so is a sliding window llama.cpp would not apply (Mistral's; Qwen2/3's with use_sliding_window) unless
--drop_sliding_window. f32, f16, bf16 and q8_0 are written here; q4_k_m, q5_k_m and q6_k by llama.cpp's own
quantizer from an f16 file.
A Qwen2-VL, Qwen2.5-VL or Gemma 3 vision-language model is written as its language model (--output_file) plus
llama.cpp's mmproj file beside it, mmproj-<name>.gguf, and checked on a picture too (vision_export.py).

The GGUF is written under a temporary name beside --output_file and checked before it gets its name:
- read back with transformers' GGUF loader (where it rebuilds the architecture): its tokenizer must encode
  a few conversations, rendered with the training chat template, to the same ids as the source's, its
  chat template must be the training one, and its logits must be within --max_relative_logit_diff;
- in llama.cpp, when llama-cpp-python is installed (bash scripts/setup.sh --with-llama-cpp; otherwise one
  warning says which check ran, if any, and --require_llama_cpp_check stops instead): the same ids for
  those conversations (special tokens parsed) and for text with CJK, emoji and llama.cpp's own
  pre-tokenizer probe, the training chat template, and, for f32/f16/bf16 (and the f16 file a k-quant is
  made from), transformers' greedy continuation of four prompts chosen by llama.cpp at every step but
  near-ties.
Only then is it renamed to --output_file and the Modelfile written beside it (model.gguf ->
model.Modelfile). A refused export exits with status 2, prints the numbers and leaves no file: the
rejected GGUF is deleted, since nothing should load a file that failed its check.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..boundary import entry_point
from ..errors import ExportError
from ..families import is_vision_language
from ..hparams import ModelArguments, parse_run
from ..hparams.run_config import as_saved, merge_record
from ..models.merging import load_adapted, load_merged
from ..utils.events import report, report_warning
from .args import EXPORT_RELATIVE_TOLERANCES, ExportArguments
from .checks import (
    GREEDY_NEW_TOKENS,
    RUN_CONFIG_KEY,
    UNCHECKED_HINT,
    check_prompts,
    check_text_gguf,
    check_texts,
    llama_cpp_line,
    llama_cpp_refusal,
    publish,
    read_back_summary,
    scratch_files,
    text_references,
    write_modelfile,
)
from .gguf_adapter import base_state_dict, write_adapter_gguf
from .gguf_arch import architecture, sliding_window
from .gguf_llama_cpp import (
    LlamaCppCheck,
    check_in_llama_cpp,
    greedy_references,
    llama_cpp_available,
    quantize,
)
from .gguf_model import RoundTrip, write_gguf
from .ollama import ollama_chat
from .rules import K_QUANTS
from .vision_export import VisionExportResult, export_vision

logger = logging.getLogger(__name__)


@dataclass
class ExportResult:
    output_file: str
    modelfile: str | None
    dtype: str
    size_bytes: int
    write_seconds: float
    check_seconds: float
    round_trip: RoundTrip | None  # None where transformers' loader cannot rebuild the architecture
    tolerance: float
    llama_cpp: LlamaCppCheck | None = None  # the written f32/f16/bf16/q8_0 file, or the f16 one a k-quant came from
    quantized: LlamaCppCheck | None = None  # the k-quant file llama.cpp's quantizer made


def _log_coverage(why_not_read_back: str, in_llama_cpp: bool) -> None:
    """One line, where one of the two checks could not run, that says which one did (or that neither did)."""
    not_read_back = f"not read back with transformers' GGUF loader ({why_not_read_back})"
    if in_llama_cpp:
        if why_not_read_back:
            report_warning(logger, "checked in llama.cpp only: %s", not_read_back)
    elif why_not_read_back:
        report_warning(logger, "NOT CHECKED: %s, and not in llama.cpp: llama-cpp-python is not installed (%s)", not_read_back,
                       UNCHECKED_HINT)
    else:
        report_warning(logger, "checked with transformers' GGUF loader only, not in llama.cpp: llama-cpp-python is not "
                       "installed (%s)", UNCHECKED_HINT)


def _warn_dropped_window(model) -> None:
    """Say once what --drop_sliding_window gave up (architecture() refuses the window without it)."""
    spec, window = architecture(model, drop_sliding_window=True), sliding_window(model.config)
    if window and not spec.writes_sliding_window:
        report_warning(logger, "written without its sliding window of %d tokens (--drop_sliding_window): llama.cpp's %s "
                       "attends to the whole context, so answers match the model's only for contexts up to %d "
                       "tokens", window[0], spec.name, window[0])


def _float32(model_args: ModelArguments) -> ModelArguments:
    """The plain ModelArguments of the source, loading in float32 (the file's dtype is applied once, as each
    tensor is written)."""
    fields = {f.name: getattr(model_args, f.name) for f in dataclasses.fields(ModelArguments)}
    return ModelArguments(**{**fields, "dtype": "float32"})


def export(model_args: ModelArguments, args: ExportArguments) -> ExportResult | VisionExportResult:
    if args.adapter_only:
        return export_adapter(model_args, args)
    dtype = model_args.dtype
    written_dtype = "f16" if dtype in K_QUANTS else dtype  # llama.cpp's quantizer starts from f16
    load_args = _float32(model_args)  # loaded (and merged) in float32
    tolerance = args.max_relative_logit_diff
    if tolerance is None:
        tolerance = EXPORT_RELATIVE_TOLERANCES[written_dtype]
    in_llama_cpp = llama_cpp_available()

    started = time.perf_counter()
    model, tokenizer = load_merged(load_args)
    source = load_args.adapter_name_or_path or load_args.model_name_or_path  # the default model's folder when None
    if is_vision_language(model):  # the text GGUF and its mmproj file
        record = json.dumps(as_saved(merge_record(model_args), args), ensure_ascii=False)
        return export_vision(model, tokenizer, dataclasses.replace(load_args, dtype=dtype), args, tolerance, source,
                             record, started)
    spec = architecture(model, args.drop_sliding_window)  # refused before the slow part
    _warn_dropped_window(model)
    refs = text_references(model, tokenizer, in_llama_cpp)
    chat, untranslatable = ollama_chat(tokenizer)

    target = Path(args.output_file).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    quantized = None
    with scratch_files(target) as scratch:
        tmp = scratch()
        record = json.dumps(as_saved(merge_record(model_args), args), ensure_ascii=False)
        write_gguf(model, tokenizer, tmp, written_dtype, os.path.basename(os.path.normpath(source)),
                   {RUN_CONFIG_KEY: record}, drop_sliding_window=args.drop_sliding_window)
        del model  # the read-back holds a second copy
        written = time.perf_counter()
        checks = check_text_gguf(spec, tmp, tokenizer, refs, tolerance, in_llama_cpp,
                                 greedy_must_match=written_dtype != "q8_0")
        problem, final = checks.problem, tmp
        if not problem and dtype in K_QUANTS:
            final = scratch()
            quantize(tmp, final, dtype)
            quantized = check_in_llama_cpp(final, tokenizer, refs.texts, refs.greedy)
            problem = llama_cpp_refusal(quantized, greedy_must_match=False)
        if problem:
            raise ExportError(f"the GGUF written from {source} ({dtype}) does not match it: {problem}; "
                              f"nothing written to {args.output_file}")
        _log_coverage(checks.why_not_read_back, in_llama_cpp)
        publish(final, target)
    checked = time.perf_counter()

    modelfile = write_modelfile(args.modelfile, target.name, chat, source, load_args.model_name_or_path,
                                load_args.adapter_name_or_path)
    result = ExportResult(str(target), modelfile, dtype, target.stat().st_size, written - started, checked - written,
                          checks.round_trip, tolerance, checks.llama_cpp, quantized)
    _report(result, source, untranslatable)
    return result


def export_adapter(model_args: ModelArguments, args: ExportArguments) -> ExportResult:
    """The adapter alone as llama.cpp's adapter GGUF, checked in llama.cpp over a base GGUF written (in the same
    dtype) for the check and deleted after it: greedy continuations as the merged model's in transformers."""
    load_args = _float32(model_args)
    started = time.perf_counter()
    peft_model, tokenizer = load_adapted(load_args, "causal_lm")
    source = load_args.adapter_name_or_path
    target = Path(args.output_file).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    check = None
    with scratch_files(target) as scratch:
        tmp, base = scratch(), scratch("base.")
        write_adapter_gguf(peft_model, tmp, model_args.dtype, os.path.basename(os.path.normpath(source)),
                           args.drop_sliding_window)
        _warn_dropped_window(peft_model.get_base_model())
        written = time.perf_counter()
        if llama_cpp_available():
            texts = check_texts(tokenizer)
            write_gguf(peft_model.get_base_model(), tokenizer, base, model_args.dtype, "base",
                       state_dict=base_state_dict(peft_model), drop_sliding_window=args.drop_sliding_window)
            merged = peft_model.merge_and_unload(safe_merge=True)
            refs = greedy_references(merged, tokenizer, check_prompts(tokenizer), GREEDY_NEW_TOKENS)
            del merged, peft_model
            check = check_in_llama_cpp(base, tokenizer, texts, refs, lora_path=tmp)
            problem = llama_cpp_refusal(check, greedy_must_match=True)
            if problem:
                raise ExportError(f"the adapter GGUF written from {source} over its base does not match the merged "
                                  f"model: {problem}; nothing written to {args.output_file}")
        else:
            report_warning(logger, "NOT CHECKED: an adapter GGUF is checked in llama.cpp only, and llama-cpp-python is not "
                           "installed (%s)", UNCHECKED_HINT)
        publish(tmp, target)
    checked = time.perf_counter()
    result = ExportResult(str(target), None, model_args.dtype, target.stat().st_size, written - started,
                          checked - written, None, 0.0, check)
    report(f"exported the adapter {source} alone -> {result.output_file} ({result.dtype}, "
          f"{result.size_bytes / 2**20:.2f} MiB) in {result.write_seconds:.1f} s; "
          + (f"checked in {result.check_seconds:.1f} s" if check else "NOT CHECKED (see the warning above)"))
    if check:
        report(llama_cpp_line(check, "over its base, against the merged model"))
    report(f"llama.cpp: llama-cli -m BASE.gguf --lora {result.output_file} (BASE.gguf: tunesmith export of the base "
          f"model); Ollama: FROM the base's GGUF, ADAPTER {result.output_file}")
    return result


def _report(r: ExportResult, source: str, untranslatable: str) -> None:
    report(f"exported {source} -> {r.output_file} ({r.dtype}, {r.size_bytes / 2**20:.1f} MiB) in {r.write_seconds:.1f} s; "
          + read_back_summary(r))
    if r.llama_cpp:
        report(llama_cpp_line(r.llama_cpp, "the f16 file it was quantized from" if r.quantized else "this file"))
    if r.quantized:
        report(llama_cpp_line(r.quantized, f"{r.dtype}, by llama.cpp's quantizer"))
    if r.modelfile:
        report(f"Ollama: ollama create NAME -f {r.modelfile} && ollama run NAME")
    else:
        report(f"no Modelfile written: {untranslatable}. llama.cpp uses the chat template embedded in the GGUF "
              "(llama-cli --jinja); for Ollama, write a TEMPLATE for it by hand.")


def run(argv: Sequence[str] | None = None) -> ExportResult | VisionExportResult:
    args = parse_run("export", argv, __doc__)
    return export(args.model, args.export)


main = entry_point(run)
