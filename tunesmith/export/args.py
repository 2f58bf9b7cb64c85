"""The settings of `tunesmith export`: the model's (where --dtype is the GGUF's tensor type) and the export's own
(where the files go, which checks it must pass). Their combinations are refused by the rows of rules.py."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams.model_args import ModelArguments

# A GGUF export rounds every weight matrix once (f16: 2^-11 of each weight; q8_0: up to 1/254 of the
# largest weight in each block of 32) and changes nothing else: llama.cpp's Q/K row order is undone
# exactly when the file is read back, so f32 gives the source's logits bit for bit. The bound is on
# max |logit difference| over the check conversations, as a fraction of the source's largest |logit|.
# Measured on the quickstart's SmolLM2-135M + LoRA: 0 (f32), 1.7e-3 (f16), 2.7e-2 (q8_0); a tiny random
# Llama with a random adapter, whose outlying weights 8-bit blocks round coarsely: 7.5e-2 (q8_0). bf16 keeps
# 8 bits of mantissa to f16's 11, so 8 times f16's rounding. The k-quants are llama.cpp's work on an f16
# file: that f16 file is what the read-back checks, against f16's bound.
EXPORT_RELATIVE_TOLERANCES = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2, "q8_0": 1e-1}


@dataclass
class ExportModelArguments(ModelArguments):
    """The model arguments of a GGUF export, where --dtype names the tensor type of the file: the model
    itself always loads in float32 (an adapter merges into it there), so that weights are rounded once."""

    dtype: Literal["f16", "q8_0", "f32", "bf16", "q4_k_m", "q5_k_m", "q6_k"] = field(  # type: ignore[assignment]
        default="f16",
        metadata={"help": "Tensor type of the GGUF's weight matrices: f16, bf16, q8_0 (8-bit blocks of 32, about "
                  "half the size of f16) or f32, written here; q4_k_m, q5_k_m or q6_k, made from an f16 file by "
                  "llama.cpp's own quantizer (needs llama-cpp-python: bash scripts/setup.sh --with-llama-cpp). "
                  "Norms stay f32, as llama.cpp keeps them."},
    )


@dataclass
class ExportArguments:
    role: ClassVar[str] = "export"
    _argument_group_name: ClassVar[str] = "GGUF export"

    output_file: str | None = field(
        default=None,
        metadata={"help": "The .gguf file to write. An Ollama Modelfile for it goes beside it, named after it "
                  "(model.gguf -> model.Modelfile); for a vision-language model, the text model goes here and "
                  "llama.cpp's mmproj file (vision tower + projector) beside it as mmproj-model.gguf."},
    )
    overwrite_output_file: bool = field(
        default=False, metadata={"help": "Replace an existing output_file, its Modelfile and its mmproj file."}
    )
    adapter_only: bool = field(
        default=False,
        metadata={"help": "Write the LoRA adapter alone as llama.cpp's adapter GGUF (general.type adapter, its lora "
                  "alpha), to load over a GGUF of its base (llama-cli -m base.gguf --lora adapter.gguf), instead of "
                  "the merged model; --dtype f32 or f16. Checked in llama.cpp over a base file written for the "
                  "check: greedy answers as the merged model's. No Modelfile is written."},
    )
    max_relative_logit_diff: float | None = field(
        default=None,
        metadata={"help": "Largest allowed max |logit difference| between the written GGUF (read back with "
                  "transformers' GGUF loader) and the source model on a few conversations, as a fraction of the "
                  "source's largest |logit|; above it the export is refused and no file is left. Default: "
                  + ", ".join(f"{v:g} ({k})" for k, v in EXPORT_RELATIVE_TOLERANCES.items()) + "."},
    )
    require_llama_cpp_check: bool = field(
        default=False,
        metadata={"help": "Stop (exit status 2, before loading) where the GGUF cannot be checked in llama.cpp because "
                  "llama-cpp-python is not installed (bash scripts/setup.sh --with-llama-cpp), instead of writing it "
                  "checked with transformers' GGUF loader only, or, for Gemma 2/3 and --adapter_only, not at all."},
    )
    drop_sliding_window: bool = field(
        default=False,
        metadata={"help": "Write a model whose sliding window llama.cpp's architecture for it does not apply (Mistral, "
                  "written as llama; Qwen2/Qwen3 with use_sliding_window) without the window, instead of refusing it: "
                  "llama.cpp then attends to the whole context, as the model does only for contexts up to the "
                  "window. Gemma 2/3's windows are written, and a window no shorter than max_position_embeddings "
                  "masks nothing; neither needs it."},
    )

    @property
    def modelfile(self) -> str | None:
        """The Ollama Modelfile's path: the output file's, with .Modelfile for .gguf."""
        if not self.output_file:
            return None
        stem = self.output_file[: -len(".gguf")] if self.output_file.endswith(".gguf") else self.output_file
        return stem + ".Modelfile"

    @property
    def mmproj_file(self) -> str | None:
        """A vision-language model's mmproj file: mmproj-<name>.gguf beside the output file (why that name:
        gguf_vision.py)."""
        if not self.output_file:
            return None
        folder, name = os.path.split(self.output_file)
        return os.path.join(folder, "mmproj-" + name)



# The dataclasses `tunesmith export` parses, in the order tunesmith_config.json and the GGUF's record keep them.
ARGUMENTS: tuple[type, ...] = (ExportModelArguments, ExportArguments)
