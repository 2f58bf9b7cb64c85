"""PEFT's prompt-based methods: prompt tuning (trained embeddings before the input), p-tuning (the same
embeddings made by a small trained MLP) and prefix tuning (trained keys and values before the input, in every
layer). Here: their PEFT configs, p-tuning's encoder kept whole in a checkpoint, and the virtual tokens as the
generation engine puts them in front of a prompt.

Why the engine needs the last: PEFT adds the virtual tokens inside its own forward, at every call. The engine
prefills once and then decodes one token at a time over its KV cache, so it runs the base model itself: the
prefill gets the virtual embeddings (or the prefix keys and values) in front of each prompt, and every decode
step after it finds them in the cache. PEFT's own generate() means to do the same, but peft 0.21.2 looks for the
cache under `past_key_values`, which transformers 5.24 passes as `cache`: it puts prompt tuning's virtual tokens
in front again at every decode step, and hands prefix tuning's prefix over where the model no longer reads it.
The reference is PEFT's forward, the function training optimised (tests/core/models/test_prompt_learning.py)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

# p-tuning's adapter file (PEFT's) holds the encoder's output only, enough to generate but not to train further:
# a checkpoint also keeps the encoder whole, here, so that a resume continues training the same MLP.
ENCODER_FILE = "prompt_encoder.safetensors"


def prompt_learning_config(finetuning_args: Any, tokenizer_path: str) -> Any:
    """The PEFT config of --finetuning_type prompt_tuning, p_tuning or prefix_tuning (a causal LM's)."""
    from peft import PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig, PromptTuningInit, TaskType

    common = {"task_type": TaskType.CAUSAL_LM, "num_virtual_tokens": finetuning_args.num_virtual_tokens}
    kind = finetuning_args.finetuning_type
    if kind == "p_tuning":
        return PromptEncoderConfig(**common)
    if kind == "prefix_tuning":
        return PrefixTuningConfig(**common)
    if finetuning_args.prompt_tuning_init_text:
        return PromptTuningConfig(**common, prompt_tuning_init=PromptTuningInit.TEXT,
                                  prompt_tuning_init_text=finetuning_args.prompt_tuning_init_text,
                                  tokenizer_name_or_path=tokenizer_path)
    # Real token embeddings, at the scale the model expects (RANDOM draws N(0, 1), far larger than most models').
    return PromptTuningConfig(**common, prompt_tuning_init=PromptTuningInit.SAMPLE_VOCAB)


def active_config(model: Any, adapter: str | None = None) -> Any | None:
    """The PEFT config of `adapter` (default: the active one) when it is a prompt-based method, else None."""
    configs = getattr(model, "peft_config", None) or {}
    config = configs.get(adapter or getattr(model, "active_adapter", None))
    return config if getattr(config, "is_prompt_learning", False) else None


def _peft_type(config: Any) -> str:
    return str(getattr(config.peft_type, "value", config.peft_type))


def _p_tuning_encoder(model: Any) -> nn.Module | None:
    """The trainable encoder (embedding and MLP) of a p-tuning adapter being trained, else None."""
    config = active_config(model)
    if config is None or _peft_type(config) != "P_TUNING" or config.inference_mode:
        return None
    return model.prompt_encoder[model.active_adapter]


def save_encoder(model: Any, output_dir: str) -> None:
    """Beside a p-tuning adapter: its whole encoder (embedding and MLP), which a resume loads back."""
    from safetensors.torch import save_file

    encoder = _p_tuning_encoder(model)
    if encoder is not None:
        state = {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items()}
        save_file(state, os.path.join(output_dir, ENCODER_FILE))


def load_encoder(model: Any, checkpoint: str) -> bool:
    """Load a p-tuning encoder saved by save_encoder (True when there was one to load)."""
    from safetensors.torch import load_file

    encoder = _p_tuning_encoder(model)
    path = os.path.join(checkpoint, ENCODER_FILE)
    if encoder is None or not os.path.isfile(path):
        return False
    encoder.load_state_dict(load_file(path, device=str(encoder.embedding.weight.device)))
    return True


def prefill_inputs(model: Any, ids: torch.Tensor, mask: torch.Tensor, on: torch.Tensor,
                   cache_argument: str) -> tuple[dict[str, Any], torch.Tensor]:
    """The base model's prefill of left-padded `ids` (`mask` 0 over the padding) with the active adapter's
    virtual tokens in front of every row, on in the rows where `on` is True (a row on the base model gets the
    same columns, masked out). Returns (the forward's inputs, the mask with the virtual columns). The prompt's
    positions follow the virtual tokens, as in training: 0.. for prompt tuning's embeddings, then the prompt;
    with prefix tuning the prompt starts at num_virtual_tokens."""
    from transformers import DynamicCache

    config = active_config(model)
    rows, width = ids.shape[0], config.num_virtual_tokens
    mask = torch.cat([on[:, None].to(mask.dtype).expand(rows, width), mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if _peft_type(config) == "PREFIX_TUNING":
        prefix = model.get_prompt(rows)  # a DynamicCache holding num_virtual_tokens positions in every layer
        cache = DynamicCache()
        for index, layer in enumerate(prefix.layers):
            cache.update(layer.keys, layer.values, index)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions[:, width:],
                cache_argument: cache}, mask
    embeds = model.word_embeddings(ids)
    prompts = model.get_prompt(rows).to(embeds.dtype)
    return {"inputs_embeds": torch.cat([prompts, embeds], dim=1), "attention_mask": mask, "position_ids": positions,
            cache_argument: DynamicCache()}, mask
