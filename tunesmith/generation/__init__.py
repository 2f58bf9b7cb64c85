"""The one generation engine (vLLM's and nanochat's shape): one sampling dataclass (sampling.py), an
incremental detokenizer and stop matching (detokenizer.py), strings banned while sampling (bans.py), continuous batching over one KV cache with
per-row settings, adapters and log-probabilities (engine.py), beam search (beam.py), the completions and events they hand back (results.py), and the worker thread
the server runs it on (worker.py). Chat, serve, compare, evaluation and RL rollouts all call it; a multi-round
conversation over it (chat_session.py) is what `tunesmith chat` and the web UI's Chat tab both hold."""

from .engine import Engine, Request, stop_token_ids
from .results import BASE, Completion, Event, TokenLogprob
from .sampling import SamplingParams

__all__ = ["BASE", "Completion", "Engine", "Event", "Request", "SamplingParams", "TokenLogprob", "stop_token_ids"]
