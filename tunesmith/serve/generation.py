"""Generate the replies of several requests together: a left-padded prefill per group of requests
that arrive together, then one token per step for every row still going, each row with its own
sampling, stop strings and token limit. Rows join the running batch between steps, and a row that
finishes (end-of-turn token, stop string, max_tokens, or its client gone) leaves it at once."""

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


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """x with zeros in front along `dim` (a cache's time axis or a mask's), up to `length`."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class Batch:
    """The rows being generated now, with their shared KV cache, attention mask (0 over each row's
    left padding), next positions and next-token logits. Rows join between steps (`admit`: their own
    prefill, then cache and mask left-padded to a common length and stacked), so a request arriving
    mid-generation starts at the next step instead of waiting for the batch to end; rows leave as they
    finish. The cache's tensors are edited the way transformers' own batch_select_indices does."""

    def __init__(self, model: Any, tokenizer: Any, stop_ids: set[int]) -> None:
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, stop_ids
        self.device = model.device
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.reset()

    def reset(self) -> None:
        """Drop every row (the next admit starts a new cache)."""
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask = self.positions = self.logits = torch.empty(0)
        self.seen: list[torch.Tensor] = []  # prompt and reply ids per row, for a repetition penalty

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def jobs(self) -> list[Job]:
        return list({id(row.job): row.job for row in self.rows}.values())

    @torch.inference_mode()
    def admit(self, jobs: list[Job]) -> None:
        """Prefill the jobs' prompts (left-padded together) and add their rows to the batch."""
        rows = [_Row(job, i, self.tokenizer) for job in jobs for i in range(job.n)]
        prompts = [row.job.prompt_ids for row in rows]
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1].float()
        seen = [torch.tensor(p, device=self.device) for p in prompts]
        if self.cache is None:
            self.rows, self.cache, self.mask, self.positions, self.logits, self.seen = \
                rows, cache, mask, positions[:, -1:], logits, seen
            return
        length = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, length, 2), _left_pad(new.keys, length, 2)])
            old.values = torch.cat([_left_pad(old.values, length, 2), _left_pad(new.values, length, 2)])
        self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(mask, length, 1)])
        self.positions = torch.cat([self.positions, positions[:, -1:]])
        self.logits = torch.cat([self.logits, logits])
        self.rows, self.seen = self.rows + rows, self.seen + seen

    @torch.inference_mode()
    def step(self) -> None:
        """Choose every row's next token, emit its text, let finished rows go, and run the model one
        token further for the others."""
        tokens = []
        for k, row in enumerate(self.rows):
            sampling = row.job.sampling
            token = next_token(self.logits[k], sampling, self.seen[k] if sampling.repetition_penalty != 1.0 else None,
                               _sampled(row.job, self.device))
            tokens.append(token)
            if row.job.cancelled:
                row.finished = True
            else:
                row.advance(token, self.stop_ids)
        keep = [k for k, row in enumerate(self.rows) if not row.finished]
        if not keep:
            self.reset()
            return
        if len(keep) < len(self.rows):
            self._select(keep)
            tokens = [tokens[k] for k in keep]
        step = torch.tensor(tokens, device=self.device)[:, None]
        self.seen = [torch.cat([s, step[k]]) for k, s in enumerate(self.seen)]
        self.mask = torch.cat([self.mask, torch.ones_like(step)], dim=-1)
        self.positions = self.positions + 1
        self.logits = self.model(input_ids=step, attention_mask=self.mask, position_ids=self.positions,
                                 past_key_values=self.cache, use_cache=True).logits[:, -1].float()

    def _select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.rows, self.seen = [self.rows[k] for k in keep], [self.seen[k] for k in keep]
        self.mask, self.positions = self.mask[index], self.positions[index]
        # Columns that are padding in every remaining row (a long row just left) are cut away.
        start = int(self.mask.any(0).nonzero()[0])
        if start:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]


def generate_batch(model: Any, tokenizer: Any, jobs: list[Job], stop_ids: set[int]) -> None:
    """Run the jobs' rows to completion together, emitting events as text comes."""
    batch = Batch(model, tokenizer, stop_ids)
    batch.admit(jobs)
    while len(batch):
        batch.step()
