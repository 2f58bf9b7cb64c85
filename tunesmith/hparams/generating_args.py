"""How replies are generated: the generation flags of chat and serve, and the defaults of the one engine's sampling
(generation/sampling.py) that every caller starts from. The chat session's and the server's own settings are their
features' (chat/args.py, serve/args.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class GenerationArguments:
    role: ClassVar[str] = "generation"
    _argument_group_name: ClassVar[str] = "generation"

    do_sample: bool = field(default=True, metadata={"help": "Sample each token; false: greedy decoding (repeatable)."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature (lower: more conservative)."})
    top_p: float = field(default=0.9, metadata={"help": "Sample from the smallest token set with this total probability."})
    top_k: int = field(default=50, metadata={"help": "Sample from the k most likely tokens (0: no limit)."})
    min_p: float = field(
        default=0.0, metadata={"help": "Drop tokens less likely than min_p times the most likely one (0: off)."}
    )
    repetition_penalty: float = field(default=1.0, metadata={"help": "Above 1 discourages repeating earlier tokens."})
    max_new_tokens: int = field(default=512, metadata={"help": "Longest reply, in tokens."})
    num_beams: int = field(
        default=1, metadata={"help": "Beam search over this many beams (1: none); chat and compare only, greedy."}
    )
