"""Multi-round chat without a terminal: the history, the token budget it is cut to, the commands,
and streamed generation. The chat recipe (recipes/chat.py) is a read-print loop around `ChatSession.handle`.

Prompts are rendered by `encode_prompt`, the same chat-template code that training uses, so a model
sees at chat time exactly the layout it was trained on."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import TextStreamer

from ..constants import ASSISTANT, SYSTEM, USER
from ..data.formats import Message
from ..data.template import encode_prompt
from ..hparams import GenerationArguments
from ..utils.io import atomic_write_text

COMMANDS = "clear (forget the history), /system TEXT (set the system prompt; /system alone restores the " \
    "default), /save FILE (append the conversation to FILE as one JSON line), quit | exit | stop"
QUIT_WORDS = ("quit", "exit", "stop")


class PromptTooLong(ValueError):
    """The system prompt and the new message alone exceed the token budget."""


@dataclass
class Outcome:
    """What one input line did: an answer (already streamed), a command's acknowledgement, an
    error to show, a request to quit, or nothing (a blank line)."""

    kind: Literal["answer", "info", "error", "quit", "nothing"]
    text: str = ""


class _CallbackStreamer(TextStreamer):
    """transformers' streamer (prompt and special tokens skipped), handing each finished piece of
    text to a callback and keeping the whole reply."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None] | None) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.on_text = on_text
        self.pieces: list[str] = []

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.pieces.append(text)
            if self.on_text is not None:
                self.on_text(text)


class ChatSession:
    """A conversation with one model. `messages` holds every user/assistant turn since the last
    `clear` (what `/save` writes); the prompt holds the system prompt plus the newest whole turns
    that fit `max_prompt_length`, and a turn once dropped for length stays dropped."""

    def __init__(self, model: Any, tokenizer: Any, generation: GenerationArguments | None = None,
                 max_prompt_length: int = 2048, system: str | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation = generation or GenerationArguments()
        self.max_prompt_length = max_prompt_length
        self.system = system
        self.messages: list[Message] = []
        self._first_turn = 0  # index (in turns) of the oldest turn still in the prompt

    def conversation(self) -> list[Message]:
        """The whole conversation, system prompt first when one is set."""
        head = [{"role": SYSTEM, "content": self.system}] if self.system else []
        return head + self.messages

    def context(self, user_text: str) -> list[Message]:
        """The messages to render for the next reply: system prompt, the newest whole turns that fit
        the token budget together with the new message, and the new message."""
        head = [{"role": SYSTEM, "content": self.system}] if self.system else []
        new = [{"role": USER, "content": user_text}]
        first = self._first_turn
        while True:
            window = head + self.messages[2 * first:] + new
            size = len(encode_prompt(self.tokenizer, window))
            if size <= self.max_prompt_length:
                self._first_turn = first
                return window
            if 2 * first >= len(self.messages):
                raise PromptTooLong(
                    f"the message and system prompt alone take {size} tokens, more than --max_prompt_length "
                    f"{self.max_prompt_length}: shorten them or raise --max_prompt_length"
                )
            first += 1

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None) -> str:
        """Generate (streaming each piece of text to on_text) and record the turn. The turn is only
        recorded once the reply is complete, so an interrupted reply leaves no half turn."""
        ids = encode_prompt(self.tokenizer, self.context(user_text))
        input_ids = torch.tensor([ids], device=self.model.device)
        streamer = _CallbackStreamer(self.tokenizer, on_text)
        self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            streamer=streamer,
            eos_token_id=self._stop_ids(),
            pad_token_id=self.tokenizer.pad_token_id,
            **self.generation.generate_kwargs(),
        )
        answer = "".join(streamer.pieces)
        self.messages += [{"role": USER, "content": user_text}, {"role": ASSISTANT, "content": answer}]
        return answer

    def _stop_ids(self) -> list[int]:
        # The tokenizer's eos is the template's end-of-turn token, which a base model's generation
        # config may not list.
        configured = self.model.generation_config.eos_token_id
        ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
        return sorted({i for i in [*ids, self.tokenizer.eos_token_id] if i is not None})

    def clear(self) -> None:
        self.messages = []
        self._first_turn = 0

    def save(self, path: str) -> int:
        """Append the conversation as one `{"messages": [...]}` line (the OpenAI format training
        reads); returns how many messages were written."""
        if not self.messages:
            raise ValueError("nothing to save yet: the conversation is empty")
        existing = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                existing = f.read()
            if existing and not existing.endswith("\n"):
                existing += "\n"
        conversation = self.conversation()
        atomic_write_text(path, existing + json.dumps({"messages": conversation}, ensure_ascii=False) + "\n")
        return len(conversation)

    def handle(self, line: str, on_text: Callable[[str], None] | None = None) -> Outcome:
        """Run one input line: a command, or a user message to answer."""
        text = line.strip()
        word, _, rest = text.partition(" ")
        if not text:
            return Outcome("nothing")
        if text.lower() in QUIT_WORDS:
            return Outcome("quit")
        if text.lower() == "clear":
            self.clear()
            return Outcome("info", "history cleared")
        if word == "/system":
            self.system = rest.strip() or None
            return Outcome("info", "system prompt set" if self.system else "system prompt back to the template's default")
        if word == "/save":
            path = os.path.expanduser(rest.strip())
            if not path:
                return Outcome("error", "usage: /save FILE")
            try:
                count = self.save(path)
            except (OSError, ValueError) as e:
                return Outcome("error", f"/save {path}: {e}")
            return Outcome("info", f"saved {count} messages to {path}")
        if word.startswith("/"):
            return Outcome("error", f"unknown command {word}; commands: {COMMANDS}")
        try:
            return Outcome("answer", self.reply(text, on_text))
        except PromptTooLong as e:
            return Outcome("error", str(e))
