"""The one generation engine: continuous batching over a shared KV cache. Requests join the running
batch between decode steps (their own prefill, then cache and mask left-padded to a common length and
stacked) and each row leaves as soon as it finishes (an end-of-turn token, a stop string, its token
limit, or its caller gone), each row with its own sampling settings, adapter and log-probabilities.

Callers: `Engine.generate` (chat, compare, evaluation, RL rollouts: a list of prompts in, their
completions out, optionally streamed through `on_event`) and the server's worker thread
(generation/worker.py), which admits requests as they arrive. Nothing else in tunesmith samples a token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from ..models import prompt_learning
from ..models.kv_cache import cache_argument
from ..models.vision_positions import prefill_positions
from .bans import Bans
from .beam import beam_search
from .detokenizer import IncrementalDecoder, StopMatcher
from .results import BASE, Completion, Event, TokenLogprob
from .sampling import SamplingParams, choose_tokens, token_logprobs


class Request:
    """One prompt to answer `params.n` times, how, with which adapter (None: the model as loaded; BASE:
    every adapter off; else an adapter name), and where its events go (`emit`, called on the thread
    that runs the engine). `cancelled` is set when its caller is gone. Filled in as it runs:
    `prompt_logprobs` (when asked) and `completions`."""

    def __init__(self, prompt_ids: Sequence[int], params: SamplingParams, emit: Callable[[Event], None] | None = None,
                 adapter: str | None = None) -> None:
        self.prompt_ids, self.params, self.adapter = list(prompt_ids), params, adapter
        # a vision-language model's image inputs for the prefill (data/images.ImagePrompt); None for text
        self.vision: dict[str, Any] | None = getattr(prompt_ids, "vision", None)
        self.emit = emit or (lambda event: None)
        self.cancelled = False
        self.generator: torch.Generator | None = None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.completions: list[Completion | None] = [None] * params.n

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def done(self) -> bool:
        return all(c is not None for c in self.completions)

    def end_unstarted(self) -> None:
        """Cancelled before its rows were admitted: each reply not yet finished ends "cancelled", and its
        caller hears so (a caller waiting for every reply's finish would otherwise wait forever)."""
        for index, completion in enumerate(self.completions):
            if completion is None:
                self.completions[index] = Completion(index, [], "", "cancelled")
                self.emit(Event(index, finish_reason="cancelled"))


class _Row:
    """One reply being generated."""

    def __init__(self, request: Request, index: int, tokenizer: Any) -> None:
        self.request, self.index = request, index
        self.decoder = IncrementalDecoder(tokenizer)
        self.matcher = StopMatcher(request.params.stop)
        self.logprobs: list[TokenLogprob] | None = [] if request.params.logprobs else None
        self._unsent = 0  # logprobs not yet sent with an event
        self.finished = False

    def advance(self, token: int, stop_ids: set[int], logprob: TokenLogprob | None) -> None:
        """Take one generated token; emit the text it releases, and the finish when there is one."""
        if token in stop_ids or token in self.request.params.stop_token_ids:
            return self.finish("stop", token, logprob)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        self.matcher.feed(self.decoder.add(token))
        if self.matcher.stopped:
            return self.finish("stop")
        if len(self.decoder.ids) >= self.request.params.max_new_tokens:
            return self.finish("length")
        piece = self.matcher.release()
        if piece:
            self.request.emit(Event(self.index, piece, self._new_logprobs()))

    def finish(self, reason: str, stop_token: int | None = None, stop_logprob: TokenLogprob | None = None) -> None:
        self.matcher.feed(self.decoder.flush())
        self.finished = True
        tokens = list(self.decoder.ids)
        self.request.completions[self.index] = Completion(self.index, tokens, self.matcher.text, reason, stop_token,
                                                          self.logprobs,
                                                          stop_logprob if self.logprobs is not None else None)
        self.request.emit(Event(self.index, self.matcher.release(final=True), self._new_logprobs(), reason,
                                len(tokens)))

    def _new_logprobs(self) -> list[TokenLogprob]:
        if not self.logprobs:
            return []
        new, self._unsent = self.logprobs[self._unsent:], len(self.logprobs)
        return new


def stop_token_ids(model: Any | None, tokenizer: Any) -> set[int]:
    """Tokens that end a reply: the model's configured eos ids and the tokenizer's eos, which is the
    template's end-of-turn token that a base model's generation config may not list."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)  # model may be None
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    return {i for i in [*ids, tokenizer.eos_token_id] if i is not None}


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """x with zeros in front along `dim` (a cache's time axis or a mask's), up to `length`."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _logprob_records(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> list[TokenLogprob]:
    chosen, values, ids = token_logprobs(logits, tokens, top)
    alternatives = ([list(zip(i.tolist(), v.tolist())) for i, v in zip(ids, values)] if values is not None
                    else [[] for _ in range(len(chosen))])
    return [TokenLogprob(int(t), float(c), a) for t, c, a in zip(tokens.tolist(), chosen.tolist(), alternatives)]


class Batch:
    """The rows being generated now, with their shared KV cache, attention mask (0 over each row's left
    padding), next positions, next-token logits and adapters. The cache's tensors are edited the way
    transformers' own batch_select_indices does."""

    def __init__(self, model: Any, tokenizer: Any, stop_ids: set[int] | None = None,
                 default_adapter: str | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids = stop_token_ids(model, tokenizer) if stop_ids is None else stop_ids
        self.device = model.device
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.cache_arg = cache_argument(model)
        # What a request's adapter None means: the adapter active when the engine was made (a batch on one
        # adapter switches the model to it, so the active one at a later batch's start may be another).
        self.default_adapter = default_adapter or getattr(model, "active_adapter", None)
        # peft runs rows of different LoRA adapters in one forward (adapter_names); DoRA and other tuners not.
        configs = getattr(model, "peft_config", {}) or {}
        self.mixes_adapters = all(str(getattr(c, "peft_type", "")).endswith("LORA") and not getattr(c, "use_dora", False)
                                  for c in configs.values())
        # A prompt-based adapter (the model's only one: serve refuses it beside others): the engine runs the base
        # model and puts the virtual tokens in front of each prompt at its prefill (models/prompt_learning.py).
        self.virtual = prompt_learning.active_config(model, self.default_adapter) is not None
        self.reset()

    def reset(self) -> None:
        """Drop every row (the next admit starts a new cache)."""
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask = self.positions = self.logits = torch.empty(0)
        self.prompts: list[torch.Tensor] = []  # prompt ids per row, for a repetition penalty

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def requests(self) -> list[Request]:
        return list({id(row.request): row.request for row in self.rows}.values())

    def _forward(self, adapters: list[str | None], **inputs: Any) -> Any:
        """The model's forward with each row's adapter (None: the one active when the batch was made): all
        rows on one adapter switch to it; rows on several run as a peft mixed batch (adapter_names). With a
        prompt-based adapter the base model runs: its virtual tokens are in the inputs or the cache already."""
        if self.virtual:
            return self.model.get_base_model()(**inputs)
        names = {self.default_adapter if a is None else a for a in adapters}
        if self.default_adapter is None or not names:
            return self.model(**inputs)
        if names == {BASE}:
            with self.model.disable_adapter():
                return self.model(**inputs)
        if len(names) == 1:
            [name] = names
            if self.model.active_adapter != name:  # frozen: an inference switch must not make it trainable
                self.model.set_adapter(name, inference_mode=True)
            return self.model(**inputs)
        return self.model(**inputs, adapter_names=[self.default_adapter if a is None else a for a in adapters])

    def admit(self, requests: list[Request]) -> None:
        """Prefill the requests' prompts and add their rows to the batch: text prompts left-padded together, each
        prompt with images on its own (its image inputs are the model's own shapes) and copied to its `n` rows. A
        request for no new tokens (max_new_tokens 0, for its prompt's log-probabilities) finishes here."""
        text = [r for r in requests if r.vision is None]
        if text:
            self._admit(text)
        for request in requests:
            if request.vision is not None:
                self._admit([request])

    @torch.inference_mode()
    def _admit(self, requests: list[Request]) -> None:
        rows = [_Row(r, i, self.tokenizer) for r in requests for i in range(r.n)]
        vision = requests[0].vision  # one request when it has images
        prompts = [row.request.prompt_ids for row in rows[:1 if vision is not None else len(rows)]]
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        want_prompt = any(r.params.prompt_logprobs for r in requests)
        if self.virtual:  # the adapter's virtual tokens in front of every row not on the base model
            on = torch.tensor([(row.request.adapter or self.default_adapter) != BASE for row in rows], device=self.device)
            inputs, mask = prompt_learning.prefill_inputs(self.model, ids, mask, on, self.cache_arg)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
        else:
            inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, self.cache_arg: DynamicCache()}
        if vision is not None:  # the pictures' inputs, and the model's positions for them (Qwen's M-RoPE)
            inputs |= {key: value.to(self.device) for key, value in vision.items()}
            inputs["position_ids"], positions = prefill_positions(self.model, ids, mask, vision)
        cache = inputs[self.cache_arg]
        logits = self._forward([row.request.adapter for row in rows[:len(prompts)]], **inputs, use_cache=True,
                               logits_to_keep=0 if want_prompt else 1).logits[:, -ids.size(1):]
        if vision is not None and len(rows) > 1:  # the prompt ran once: its cache and logits serve every row
            index = torch.zeros(len(rows), dtype=torch.long, device=self.device)
            cache.batch_select_indices(index)
            ids, mask, positions, logits = ids[index], mask[index], positions[index], logits[index]
        if want_prompt:
            self._prompt_logprobs(rows, ids, logits)
        logits = logits[:, -1].float()
        for row in rows:
            row.request.generator = row.request.generator or self._generator(row.request)
            if row.request.params.max_new_tokens == 0:
                row.finish("length")
        keep = [k for k, row in enumerate(rows) if not row.finished]
        if not keep:
            return
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(index)
            rows, mask, positions, logits = [rows[k] for k in keep], mask[index], positions[index], logits[index]
        new_prompts = [torch.tensor(row.request.prompt_ids, device=self.device) for row in rows]
        if self.cache is None:
            self.rows, self.cache, self.mask, self.positions, self.logits, self.prompts = \
                rows, cache, mask, positions[:, -1:], logits, new_prompts
            return
        length = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, length, 2), _left_pad(new.keys, length, 2)])
            old.values = torch.cat([_left_pad(old.values, length, 2), _left_pad(new.values, length, 2)])
        self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(mask, length, 1)])
        self.positions = torch.cat([self.positions, positions[:, -1:]])
        self.logits = torch.cat([self.logits, logits])
        self.rows, self.prompts = self.rows + rows, self.prompts + new_prompts

    def _generator(self, request: Request) -> torch.Generator | None:
        # A seeded request draws from a generator of its own, so its replies repeat whatever else runs.
        if request.params.seed is None or request.params.greedy:
            return None
        return torch.Generator(device=self.device).manual_seed(request.params.seed)

    def _prompt_logprobs(self, rows: list[_Row], ids: torch.Tensor, logits: torch.Tensor) -> None:
        """Each asking request's prompt tokens' log-probabilities: the logits at position t predict token t+1."""
        for k, row in enumerate(rows):
            request = row.request
            if not request.params.prompt_logprobs or request.prompt_logprobs is not None:
                continue
            length = len(request.prompt_ids)
            start = ids.size(1) - length
            records = _logprob_records(logits[k, start:-1].float(), ids[k, start + 1:], request.params.top_logprobs)
            request.prompt_logprobs = [None, *records]

    @torch.inference_mode()
    def step(self) -> None:
        """Choose every row's next token, emit its text, let finished rows go, and run the model one
        token further for the others."""
        params = [row.request.params for row in self.rows]
        replies = [torch.tensor(row.decoder.ids, dtype=torch.long, device=self.device) for row in self.rows] \
            if any(p.penalised for p in params) else None
        tokens, processed = choose_tokens(self.logits, params, [row.request.generator for row in self.rows],
                                          self.prompts, replies, self._banned(params))
        logprobs: list[TokenLogprob | None] = [None] * len(self.rows)
        asking = [k for k, p in enumerate(params) if p.logprobs]
        if asking:
            top = max(params[k].top_logprobs for k in asking)
            index = torch.tensor(asking, device=self.device)
            source = torch.stack([(processed if params[k].processed_logprobs else self.logits)[k] for k in asking])
            for k, record in zip(asking, _logprob_records(source, tokens[index], top)):
                record.top = record.top[:params[k].top_logprobs]
                logprobs[k] = record
        tokens = tokens.tolist()
        for k, row in enumerate(self.rows):
            if row.request.cancelled:
                row.finish("cancelled")
            else:
                row.advance(tokens[k], self.stop_ids, logprobs[k])
        keep = [k for k, row in enumerate(self.rows) if not row.finished]
        if not keep:
            self.reset()
            return
        if len(keep) < len(self.rows):
            self._select(keep)
            tokens = [tokens[k] for k in keep]
        step = torch.tensor(tokens, device=self.device)[:, None]
        self.mask = torch.cat([self.mask, torch.ones_like(step)], dim=-1)
        self.positions = self.positions + 1
        self.logits = self._forward([row.request.adapter for row in self.rows], input_ids=step,
                                    attention_mask=self.mask, position_ids=self.positions, **{self.cache_arg: self.cache},
                                    use_cache=True).logits[:, -1].float()

    def _banned(self, params: list[SamplingParams]) -> list[list[int]] | None:
        """Each row's tokens that may not come next, from its reply's text so far (bans.py); None when no
        row bans anything."""
        if not any(p.bans for p in params):
            return None
        bans = Bans.of(self.tokenizer)
        return [bans.tokens(row.matcher.text, p.banned_strings, p.banned_openings) if p.bans else []
                for row, p in zip(self.rows, params)]

    def _select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.rows, self.prompts = [self.rows[k] for k in keep], [self.prompts[k] for k in keep]
        self.mask, self.positions, self.logits = self.mask[index], self.positions[index], self.logits[index]
        # Columns that are padding in every remaining row (a long row just left) are cut away.
        start = int(self.mask.any(0).nonzero()[0])
        if start:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]

    @torch.inference_mode()
    def idle_forward(self) -> None:
        """One forward that generates nothing: under ZeRO-3 a rank whose rows are done keeps pace with
        the others, since every forward gathers the sharded weights collectively."""
        self.model(input_ids=torch.tensor([[self.pad]], device=self.device), use_cache=False)


class Engine:
    """Generation for one model (a peft model serves its adapters by name). `synced`: several processes
    run the same number of forwards (ZeRO-3), each stepping until every one is done."""

    def __init__(self, model: Any, tokenizer: Any, synced: bool = False) -> None:
        self.model, self.tokenizer, self.synced = model, tokenizer, synced
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.default_adapter = getattr(model, "active_adapter", None)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 adapter: str | None = None, on_event: Callable[[int, Event], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, max_batch_size: int | None = None
                 ) -> list[list[Completion]]:
        """Every prompt's `n` completions. `on_event(prompt_index, event)` hears the text as it comes;
        `should_stop()` returning True cancels what is still running (its replies end "cancelled").
        Prompts join the batch as rows leave, `max_batch_size` rows at most (default: all at once)."""
        settings = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if any(p.num_beams > 1 for p in settings):
            if any(p.bans for p in settings):
                raise ValueError("banned_strings and banned_openings work while sampling token by token, not with "
                                 "beam search: use num_beams 1")
            if any(getattr(p, "vision", None) is not None for p in prompts):
                raise ValueError("beam search takes text prompts only, not pictures: use num_beams 1")
            return beam_search(self.model, self.tokenizer, prompts, settings, self.stop_ids, adapter)
        requests = [Request(p, s, (lambda e, i=i: on_event(i, e)) if on_event else None, adapter)
                    for i, (p, s) in enumerate(zip(prompts, settings))]
        batch = Batch(self.model, self.tokenizer, self.stop_ids, self.default_adapter)
        waiting = list(requests)
        limit = max_batch_size or sum(r.n for r in requests) or 1
        while True:
            admit = []
            while waiting and (not admit and not len(batch) or len(batch) + sum(r.n for r in admit) + waiting[0].n
                               <= limit):
                admit.append(waiting.pop(0))
            if admit:
                batch.admit(admit)
            if should_stop is not None and should_stop():
                for request in requests:
                    request.cancelled = True
                waiting = []
            busy = bool(len(batch) or waiting)
            if self.synced and not self._anyone_busy(busy):
                break
            if not self.synced and not busy:
                break
            if len(batch):
                batch.step()
            elif self.synced:
                batch.idle_forward()
        for request in requests:
            request.end_unstarted()
        return [list(r.completions) for r in requests]

    def _anyone_busy(self, busy: bool) -> bool:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return busy
        flag = torch.tensor([1.0 if busy else 0.0], device=self.model.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
