"""PEFT's trainable tokens beside a LoRA adapter (--lora_trainable_tokens): only the named rows of the input
embeddings and of the output head train (one matrix where the model ties them), and the adapter file holds those
rows alone, not the whole matrices that --lora_modules_to_save embed_tokens,lm_head would save. The flag names
tokens as a user reads them; PEFT takes ids."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..distributed import fsdp_requested, zero_stage
from ..errors import ConfigError

logger = logging.getLogger(__name__)


def trainable_token_indices(entries: Sequence[str], model: nn.Module, training_args: Any,
                            tokenizer_for: Callable[[], Any]) -> dict[str, list[int]] | None:
    """PEFT's trainable_token_indices for --lora_trainable_tokens: the rows, in the input embeddings and in the
    output head when the model has one over the same vocabulary. A head tied to the embeddings is left to PEFT, which
    sees the same rows named in both and keeps the two one matrix; an untied head trains its own rows of the tokens,
    which a new language needs as much as their embeddings (the model must also produce them)."""
    if not entries:
        return None
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    _check_sharding(training_args, tied=head is not None and head.weight is embeddings.weight)
    ids = trainable_token_ids(entries, model, tokenizer_for)
    names = {module: name for name, module in model.named_modules()}
    targets = {names[embeddings]: ids}
    if head is not None and head in names and head.weight.shape == embeddings.weight.shape:
        targets[names[head]] = ids
    return targets


def _check_sharding(training_args: Any, tied: bool) -> None:
    """What PEFT 0.21's trainable tokens cannot be sharded by, refused in one line (found on two CPU ranks)."""
    if training_args is None:
        return
    if fsdp_requested(training_args) and tied:
        raise ConfigError("--lora_trainable_tokens under FSDP on a model whose head is its embedding matrix: PEFT "
                          "shares the trained rows between the two, and FSDP2 cannot shard the one unit accelerate "
                          "makes of them; use --deepspeed configs/ds_zero2.json (or one process)")
    if zero_stage(training_args) == 3 and not torch.cuda.is_available():
        raise ConfigError("--lora_trainable_tokens under ZeRO-3 without a CUDA device: PEFT gathers the rows it "
                          "trains on a CUDA device; use configs/ds_zero2.json on this machine")


def trainable_token_ids(entries: Sequence[str], model: nn.Module, tokenizer_for: Callable[[], Any]) -> list[int]:
    """The embedding rows --lora_trainable_tokens names, in order, each once: an entry is a row id, a text that
    encodes as one token (`é`, `<|im_start|>`), or an entry of the vocabulary as the tokenizer spells it (`Ġriver`).
    `tokenizer_for` loads the tokenizer, only when an entry is not an id."""
    if not entries:
        return []
    rows = model.get_input_embeddings().weight.shape[0]
    tokenizer, ids = None, []
    for entry in entries:
        if entry.isdigit():
            token_id = int(entry)
            if token_id >= rows:
                raise ConfigError(f"--lora_trainable_tokens {entry}: the model's embeddings have {rows} rows (ids 0 "
                                  f"to {rows - 1}); tunesmith does not add tokens: name a token of the vocabulary")
        else:
            tokenizer = tokenizer or tokenizer_for()
            token_id = _token_id(tokenizer, entry)
        if token_id not in ids:
            ids.append(token_id)
    logger.info("trainable tokens: %d rows of the input embeddings train beside the adapter (ids %s)", len(ids),
                ids[:20] if len(ids) <= 20 else f"{ids[:20]}...")
    return ids


def _token_id(tokenizer: Any, entry: str) -> int:
    """The id of a text that encodes as exactly one token, else of a vocabulary entry as the tokenizer spells it; a
    ConfigError otherwise. The text comes first: a byte-level vocabulary spells bytes as characters, so its entry
    `é` is the byte 0xe9, while the text é is the token `Ã©` (its two UTF-8 bytes)."""
    ids = tokenizer.encode(entry, add_special_tokens=False)
    if len(ids) == 1:
        return ids[0]
    vocabulary = tokenizer.get_vocab()  # added and special tokens included
    if entry in vocabulary:
        return vocabulary[entry]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    raise ConfigError(f"--lora_trainable_tokens {entry!r} is not a token of the vocabulary (it encodes as {len(ids)} "
                      f"tokens: {pieces[:8]}): name those pieces or their ids ({ids[:8]}); tunesmith does not add "
                      "tokens to a tokenizer")
