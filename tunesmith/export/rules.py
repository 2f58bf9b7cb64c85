"""The rows of `tunesmith export`: settings that cannot work, refused in one line after parsing and before any weight
loads (the parser checks them after the core's rows, hparams/rules.py, for this command only), and the facts they
read, each stored once: here the k-quants made by llama.cpp's quantizer; the vision-language model types exported
with an mmproj file are the model-family registry's (families.py), the architectures written gguf_arch.ARCHITECTURES,
the writer's own table."""

from __future__ import annotations

import os
from typing import Any

from ..errors import PathError
from ..families import types_where
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import NOTHING_TO_MERGE, problem_values, prompt_adapter, vision_model
from ..utils.paths import (
    adapter_config,
    is_adapter_dir,
    is_torchao_quantized,
    model_architecture,
    problem_with_output_dir,
)
from .gguf_arch import ARCHITECTURES
from .gguf_llama_cpp import llama_cpp_available
from .gguf_mtmd import mtmd_library_found

# The --dtype values llama.cpp's own quantizer makes from an f16 file (gguf_llama_cpp.quantize); the others are
# written here.
K_QUANTS = ("q4_k_m", "q5_k_m", "q6_k")
# The vision-language model types exported as a text GGUF plus llama.cpp's mmproj file (and why Idefics3's, whose
# files gguf_vision.py writes too, is not): the registry's entries, families.py.
EXPORTABLE_VISION_TYPES = types_where("gguf_exported")

def _not_exportable(model: Any) -> dict | None:
    """{"arch": ...} when the model (the base, for an adapter) is a local folder of another architecture (an
    exportable vision-language model is one of its own)."""
    arch = model_architecture(model.model_name_or_path) if model.model_name_or_path else None
    if vision_model(model):
        return None  # the export_vision row decides
    return {"arch": arch} if arch and arch not in ARCHITECTURES else None


def _exists(path: str | None) -> bool:
    return bool(path) and os.path.exists(path)


def _output_taken(a: Any) -> dict | None:
    """{"path"}: the first file the export writes that exists already, unless --overwrite_output_file."""
    if a.export.overwrite_output_file:
        return None
    outputs = (a.export.output_file, a.export.modelfile, *([a.export.mmproj_file] if vision_model(a.model) else []))
    return next(({"path": p} for p in outputs if _exists(p)), None)


def _vision_type_not_exported(a: Any) -> dict | None:
    """{"model_type"}: a vision-language model of a type GGUF export does not write."""
    vision = vision_model(a.model)
    return vision if vision and vision["model_type"] not in EXPORTABLE_VISION_TYPES else None


RULES: list[Rule] = [
    Rule("export_output_given", ("export",), lambda a: not a.export.output_file,
         "--output_file is required: the .gguf file to write (e.g. outputs/sft_demo.gguf)."),
    Rule("export_output_suffix", ("export",), lambda a: not a.export.output_file.endswith(".gguf"),
         "--output_file {export.output_file}: name it *.gguf (its Modelfile is named after it)."),
    Rule("export_output_path", ("export",),
         lambda a: problem_values(problem_with_output_dir(os.path.dirname(os.path.abspath(a.export.output_file)))),
         "--output_file {export.output_file}: {problem}; choose another place.", PathError),
    Rule("export_output_free", ("export", "model"), _output_taken,
         "{path} exists: choose another --output_file, or pass --overwrite_output_file.", PathError),
    Rule("export_unquantized", ("export", "model"), lambda a: a.model.quantization_bit is not None,
         "--quantization_bit cannot be used with export: the model loads in float32 and --dtype chooses how the "
         "GGUF stores it; drop the flag."),
    Rule("export_torchao", ("export", "model"), lambda a: is_torchao_quantized(a.model.model_name_or_path),
         "export: {model.model_name_or_path} is torchao-quantized (a --qat run's quantized/), and GGUF has no type for "
         "torchao's int4 tensors and their scales: export the run's float model (its output_dir; a LoRA run's "
         "adapter over its base) with --dtype q4_0 or another type, or serve quantized/ with tunesmith serve."),
    Rule("export_prompt_learning", ("export", "model"), lambda a: prompt_adapter(a.model),
         "export: " + NOTHING_TO_MERGE.replace("to merge.", "to merge and export (llama.cpp has no virtual "
                                                "tokens).")),
    Rule("export_causal_lm", ("export", "model"),
         lambda a: is_adapter_dir(a.model.adapter_name_or_path)
         and adapter_config(a.model.adapter_name_or_path).get("task_type") == "SEQ_CLS",
         "{model.adapter_name_or_path} is a reward-model adapter (task_type SEQ_CLS): export_gguf writes chat "
         "models (causal LMs) only."),
    Rule("export_vision", ("export", "model"), _vision_type_not_exported,
         "GGUF export of a vision-language model writes " + ", ".join(EXPORTABLE_VISION_TYPES) + " (the text model and "
         "llama.cpp's mmproj file); this one is {model_type}: serve its folder with tunesmith serve, transformers or "
         "vLLM."),
    Rule("export_vision_whole", ("export", "model"),
         lambda a: vision_model(a.model) and (a.export.adapter_only or a.model.dtype in K_QUANTS),
         "--adapter_only and the k-quants (--dtype q4_k_m, q5_k_m, q6_k) are not built for vision-language models: "
         "export the whole model with --dtype f32, f16, bf16 or q8_0."),
    Rule("export_architecture", ("export", "model"), lambda a: _not_exportable(a.model),
         "export_gguf supports " + ", ".join(tuple(ARCHITECTURES)) + "; this model is {arch} "
         "({model.model_name_or_path}/config.json)."),
    Rule("export_adapter_only_needs_adapter", ("export", "model"),
         lambda a: a.export.adapter_only and not a.model.adapter_name_or_path,
         "--adapter_only writes a LoRA adapter, and no adapter was given: pass an adapter folder as "
         "--model_name_or_path (or --adapter_name_or_path), or leave out --adapter_only."),
    Rule("export_adapter_only_dtype", ("export", "model"),
         lambda a: a.export.adapter_only and a.model.dtype not in ("f32", "f16"),
         "--adapter_only writes the adapter's matrices in f32 or f16 (got --dtype {model.dtype}): llama.cpp applies "
         "them over a base of any type."),
    Rule("export_k_quant", ("export", "model"),
         lambda a: a.model.dtype in K_QUANTS and not llama_cpp_available(),
         "--dtype {model.dtype} is made by llama.cpp's quantizer, and llama-cpp-python is not installed: run "
         "`bash scripts/setup.sh --with-llama-cpp`, or choose f32, f16, bf16 or q8_0."),
    Rule("export_llama_cpp_check", ("export",),
         lambda a: a.export.require_llama_cpp_check and not llama_cpp_available(),
         "--require_llama_cpp_check: llama-cpp-python is not installed, so the GGUF cannot be checked in llama.cpp: "
         "run `bash scripts/setup.sh --with-llama-cpp`, or leave out the flag."),
    Rule("export_llama_cpp_mtmd_check", ("export", "model"),
         lambda a: a.export.require_llama_cpp_check and vision_model(a.model) and not mtmd_library_found(),
         "--require_llama_cpp_check: llama-cpp-python was built without its multimodal library (mtmd), so the mmproj "
         "file cannot be checked in llama.cpp: run `bash scripts/setup_llama_cpp.sh` (it builds with mtmd), or leave "
         "out the flag."),
    Rule("export_tolerance", ("export",),
         lambda a: a.export.max_relative_logit_diff is not None and not a.export.max_relative_logit_diff >= 0,
         "--max_relative_logit_diff must be >= 0 (got {export.max_relative_logit_diff}); leave it out for the "
         "default of the --dtype."),
]
