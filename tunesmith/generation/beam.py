"""Beam search, for the offline callers that ask for it (chat, compare with --num_beams): transformers'
own implementation, run one prompt at a time, its output shaped as the engine's completions. It is the
one place tunesmith calls `generate()`: a beam reply is chosen at its end, so it streams nothing and
has no per-token log-probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from .results import BASE, Completion
from .sampling import SamplingParams


@torch.inference_mode()
def beam_search(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], settings: Sequence[SamplingParams],
                stop_ids: set[int], adapter: str | None = None) -> list[list[Completion]]:
    results = []
    for prompt, params in zip(prompts, settings):
        config = GenerationConfig(num_beams=params.num_beams, num_return_sequences=min(params.n, params.num_beams),
                                  do_sample=False, max_new_tokens=params.max_new_tokens,
                                  repetition_penalty=params.repetition_penalty, eos_token_id=sorted(stop_ids),
                                  pad_token_id=tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None)
        input_ids = torch.tensor([list(prompt)], device=model.device)
        kwargs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "generation_config": config}
        if adapter == BASE:
            with model.disable_adapter():
                out = model.generate(**kwargs)
        else:
            out = model.generate(**kwargs)
        completions = []
        for index, row in enumerate(out[:, input_ids.size(1):].tolist()):
            ended = next((i for i, t in enumerate(row) if t in stop_ids), None)
            tokens = row if ended is None else row[:ended]
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            for stop in params.stop:
                text = text.split(stop)[0]
            completions.append(Completion(index, tokens, text, "length" if ended is None else "stop",
                                          None if ended is None else row[ended]))
        results.append(completions)
    return results
