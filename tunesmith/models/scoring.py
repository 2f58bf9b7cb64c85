"""Reward-model scores: one scalar per sequence, read at its last real token. Used by reward training,
reward/score.py, PPO's reward model and the PPO evaluation.

Why not where transformers' sequence-classification models read it (the rightmost token that
differs from the pad id): with pad == eos that is the wrong token whenever a sequence ends with eos."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def score_head(model: nn.Module) -> nn.Module:
    """The one-output `score` layer of a sequence-classification model (PEFT's trainable copy,
    DDP and DeepSpeed wrappers included: the outermost module of that name)."""
    for name, module in model.named_modules():
        if name == "score" or name.endswith(".score"):
            return module
    raise ValueError(f"{type(model).__name__} has no `score` head: load reward models with "
                     "load_model(..., task='reward')")


def cast_head_inputs_to_its_dtype(model: nn.Module) -> None:
    """Casts what reaches the score head to the dtype of the head's own weights.

    A reward model trained in half precision keeps its trained head in float32 (loader._upcast_trainable,
    so AdamW's updates are not rounded away) while the body hands it bfloat16 hidden states; without autocast
    around the forward (a GPU run with --bf16 on a bf16 model, or --dtype bfloat16) the product fails with
    "expected mat1 and mat2 to have the same dtype". Each linear layer of the head (PEFT's trainable copy and
    the frozen original it keeps beside it) casts its own input, so either may run."""
    def cast(module: nn.Module, args: tuple) -> tuple:
        dtype = module.weight.dtype
        return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() and a.dtype != dtype else a
                     for a in args)

    for module in score_head(model).modules():
        if isinstance(module, nn.Linear):
            module.register_forward_pre_hook(cast)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last attended token of each row, whichever side the padding is on."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(-1)


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    **image_inputs: Any) -> torch.Tensor:
    """One score per row: the head's output at the row's last real token.

    The head's per-token output is captured by a hook inside the model's own forward (so DDP and
    ZeRO-3, which only gather weights during that forward, still see the call), and position ids
    follow the attention mask, so a left-padded row scores exactly as it does alone. A vision-language
    reward model (Gemma 3's) also takes its processor's outputs for the rows' pictures (`image_inputs`:
    pixel_values, token_type_ids)."""
    captured: list[torch.Tensor] = []
    handle = score_head(model).register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
              **image_inputs)
    finally:
        handle.remove()
    per_token = captured[-1]
    if per_token.shape[:2] != input_ids.shape or per_token.shape[-1] != 1:
        raise ValueError(f"expected the score head to give one value per token, got shape {tuple(per_token.shape)}")
    rows = torch.arange(input_ids.shape[0], device=per_token.device)
    return per_token[rows, last_token_index(attention_mask).to(per_token.device), 0]


@torch.no_grad()
def score_sequences(model: Any, tokenizer: Any, sequences: list[list[int]], batch_size: int = 8) -> list[float]:
    """One score per sequence, in the order given (reward/score.py and PPO's RewardModelScorer); batches are
    formed by length so that little is spent on padding."""
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda k: len(sequences[k]))
    scores = [0.0] * len(sequences)
    for i in range(0, len(order), batch_size):
        chunk = order[i:i + batch_size]
        batch = tokenizer.pad({"input_ids": [sequences[k] for k in chunk]}, return_tensors="pt")
        values = sequence_scores(model, batch["input_ids"].to(device), batch["attention_mask"].to(device))
        for k, value in zip(chunk, values.float().tolist()):
            scores[k] = value
    return scores


