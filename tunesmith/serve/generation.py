"""Generate the replies of several requests together: one left-padded prefill, then one token per
step for every row still going, each row with its own sampling, stop strings and token limit. A row
that finishes (end-of-turn token, stop string, max_tokens, or its client gone) leaves the batch, so
the others stop paying for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .decoding import IncrementalDecoder, Sampling, StopMatcher, next_token


@dataclass
class Event:
    """What the worker tells a request: text for choice `index`, its finish (with the reply's token
    count), or an error that ends the request."""

    index: int = 0
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None


class Job:
    """One request: its prompt ids, n replies to generate, how, and where their events go (`emit` is
    called on the worker thread). `cancelled` is set when its client is gone."""

    def __init__(self, prompt_ids: list[int], sampling: Sampling, emit: Callable[[Event], None], n: int = 1) -> None:
        self.prompt_ids, self.sampling, self.emit, self.n = prompt_ids, sampling, emit, n
        self.cancelled = False
        self.generator: torch.Generator | None = None


class _Row:
    """One reply being generated."""

    def __init__(self, job: Job, index: int, tokenizer: Any) -> None:
        self.job, self.index = job, index
        self.decoder = IncrementalDecoder(tokenizer)
        self.matcher = StopMatcher(job.sampling.stop)
        self.finished = False

    def advance(self, token: int, stop_ids: set[int]) -> None:
        """Take one generated token; emit the text it releases, and the finish when there is one."""
        if token in stop_ids:
            return self._finish("stop")
        self.matcher.feed(self.decoder.add(token))
        if self.matcher.stopped:
            return self._finish("stop")
        if len(self.decoder.ids) >= self.job.sampling.max_tokens:
            return self._finish("length")
        piece = self.matcher.release()
        if piece:
            self.job.emit(Event(self.index, piece))

    def _finish(self, reason: str) -> None:
        self.matcher.feed(self.decoder.flush())
        self.finished = True
        self.job.emit(Event(self.index, self.matcher.release(final=True), reason, len(self.decoder.ids)))


def _sampled(job: Job, device: torch.device) -> torch.Generator | None:
    # A seeded request draws from a generator of its own, so its replies repeat whatever else runs.
    if job.sampling.seed is not None and job.generator is None:
        job.generator = torch.Generator(device=device).manual_seed(job.sampling.seed)
    return job.generator


@torch.inference_mode()
def generate_batch(model: Any, tokenizer: Any, jobs: list[Job], stop_ids: set[int]) -> None:
    """Run the jobs' rows to completion, emitting events as text comes."""
    rows = [_Row(job, i, tokenizer) for job in jobs for i in range(job.n)]
    device = model.device
    width = max(len(row.job.prompt_ids) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(r.job.prompt_ids)) + r.job.prompt_ids for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r.job.prompt_ids)) + [1] * len(r.job.prompt_ids) for r in rows],
                        device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    penalized = any(r.job.sampling.repetition_penalty != 1.0 for r in rows)
    seen = [torch.tensor(r.job.prompt_ids, device=device) for r in rows] if penalized else None
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1].float()
    live = rows
    while True:
        tokens = []
        for k, row in enumerate(live):
            token = next_token(logits[k], row.job.sampling, seen[k] if seen else None, _sampled(row.job, device))
            tokens.append(token)
            if row.job.cancelled:
                row.finished = True
            else:
                row.advance(token, stop_ids)
        keep = [k for k, row in enumerate(live) if not row.finished]
        if not keep:
            return
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
            live, tokens = [live[k] for k in keep], [tokens[k] for k in keep]
            seen = [seen[k] for k in keep] if seen else None
        step = torch.tensor(tokens, device=device)[:, None]
        if seen:
            seen = [torch.cat([s, step[k]]) for k, s in enumerate(seen)]
        mask = torch.cat([mask, torch.ones_like(step)], dim=-1)
        positions = positions[:, -1:] + 1
        logits = model(input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True).logits[:, -1].float()
