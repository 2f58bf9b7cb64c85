"""How replies are generated in chat, and the chat session's own settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class GenerationArguments:
    role: ClassVar[str] = "generation"
    _argument_group_name: ClassVar[str] = "generation"

    do_sample: bool = field(default=True, metadata={"help": "Sample each token; false: greedy decoding (repeatable)."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature (lower: more conservative)."})
    top_p: float = field(default=0.9, metadata={"help": "Sample from the smallest token set with this total probability."})
    top_k: int = field(default=50, metadata={"help": "Sample from the k most likely tokens (0: no limit)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Above 1 discourages repeating earlier tokens."})
    max_new_tokens: int = field(default=512, metadata={"help": "Longest reply, in tokens."})

    def generate_kwargs(self) -> dict[str, Any]:
        """Every sampling setting, explicitly (greedy: none of them), so that the model's own
        generation_config.json cannot add a top_k/top_p that transformers then warns about."""
        kwargs: dict[str, Any] = {"do_sample": self.do_sample, "max_new_tokens": self.max_new_tokens,
                                  "repetition_penalty": self.repetition_penalty}
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        return kwargs


@dataclass
class ChatArguments:
    role: ClassVar[str] = "chat"
    _argument_group_name: ClassVar[str] = "chat"

    system: str | None = field(
        default=None, metadata={"help": "System prompt to start with (default: the chat template's own, if any)."}
    )
    max_prompt_length: int = field(
        default=2048,
        metadata={"help": "Longest prompt in tokens (system prompt + history + new message); the oldest whole "
                  "turns are dropped to fit."},
    )
