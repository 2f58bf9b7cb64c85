"""Tiny random models of real architectures, built from transformers' own config classes: hidden 64, 2 layers, the
default model's tokenizer, and a sliding window of WINDOW tokens (shorter than the test conversations) on every
architecture that has one, with one sliding and one full layer where the architecture mixes them. The initializer's
range is 0.2 (not 0.02): with near-zero weights every attention pattern gives the same outputs and a dropped window
would not show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WINDOW = 16
MIXED = ["sliding_attention", "full_attention"]
# Per architecture: what its config needs beyond the common shape to have its distinctive attention.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW},
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    "qwen3": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1},
    "mixtral": {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma": {},
    "gemma2": {"sliding_window": WINDOW, "layer_types": MIXED},
    "gemma3_text": {"sliding_window": WINDOW, "layer_types": MIXED},
    "phi3": {"sliding_window": WINDOW},
    "olmo2": {},
    "gpt_oss": {"sliding_window": WINDOW, "layer_types": MIXED, "num_local_experts": 4, "num_experts_per_tok": 2},
    "smollm3": {},
    "granite": {},
    "cohere2": {"sliding_window": WINDOW, "layer_types": MIXED, "logit_scale": 1.0},
}


def architecture_config(name: str, tokenizer: Any, **overrides: Any) -> Any:
    """The config of a tiny `name` model (a key of transformers' CONFIG_MAPPING); KeyError if this transformers
    lacks the architecture."""
    from transformers import CONFIG_MAPPING

    shape = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024,
             "initializer_range": 0.2, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
             "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False}
    return CONFIG_MAPPING[name](**{**shape, **ARCHITECTURES.get(name, {}), **overrides})


def build_architecture(path: Path, name: str, tokenizer: Any, seed: int = 0, **overrides: Any) -> str:
    """A tiny random `name` model saved in float32 with the tokenizer beside it, as a normal model folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = architecture_config(name, tokenizer, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # some parameters start at zero or one in from_config (sinks, norms); random makes them count
        for pname, param in model.named_parameters():
            if pname.endswith("sinks"):
                param.normal_(0, 1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def packed_vs_eager(name: str, tokenizer: Any, device: str, dtype: torch.dtype,
                    lengths: tuple[int, ...] = (23, 40, 9, 31),
                    reference_dtype: torch.dtype = torch.float32) -> tuple[float, float, str]:
    """(max |logit difference| between a packed row of examples of these lengths through tunesmith's packed
    attention in `dtype` and each example alone through transformers' eager attention in `reference_dtype`, the
    largest |logit|, the packed implementation used). Forward only, no training: the kernel on its own. In bf16 give
    a bf16 reference: against float32, these random models' logits differ by about 5% of the largest from rounding
    alone, and a mixture of experts routes some tokens to other experts."""
    from transformers import AutoModelForCausalLM

    from tunesmith.models.attention import use_varlen_attention

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(architecture_config(name, tokenizer), attn_implementation="eager",
                                             dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("sinks"):
                param.normal_(0, 1)
    generator = torch.Generator().manual_seed(1)
    examples = [torch.randint(100, len(tokenizer) - 100, (n,), generator=generator).to(device) for n in lengths]
    with torch.no_grad():
        model.to(reference_dtype)
        reference = torch.cat([model(input_ids=e[None]).logits[0].float() for e in examples])
        model.to(dtype).set_attn_implementation("sdpa" if model._supports_sdpa else "eager")
        implementation = use_varlen_attention(model)
        bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        packed = model(input_ids=torch.cat(examples)[None], use_cache=False, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
                       max_length_q=max(lengths), max_length_k=max(lengths),
                       position_ids=torch.cat([torch.arange(n, device=device) for n in lengths])[None]).logits[0]
    return float((packed.float() - reference).abs().max()), float(reference.abs().max()), implementation
