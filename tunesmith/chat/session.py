"""Multi-round chat without a terminal: the history, the token budget it is cut to, the commands,
and streamed generation (the one engine, generation/) that a Ctrl-C can stop. The chat recipe (recipes/chat.py) is a read-print
loop around `ChatSession.handle`.

Prompts are rendered by `encode_prompt`, the same chat-template code that training uses, so a model
sees at chat time exactly the layout it was trained on."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..constants import ASSISTANT, LOSS_FLAG, SYSTEM, USER
from ..data.formats import Message
from ..data.template import PromptTooLong, fit_prompt
from ..generation import Engine, SamplingParams
from ..hparams import GenerationArguments
from ..utils.io import atomic_write_text

COMMANDS = ("/clear (forget the history; the system prompt stays), /system TEXT (set the system prompt; /system "
            "alone: the template's default), /save FILE (append the conversation to FILE as training data), "
            "/quit, /help; a line starting with // is a message that starts with /")
# Words that leave when typed alone, in a terminal only: there a person typing just `quit` means it,
# while a piped line is data (a script ends with /quit or the end of its input).
BARE_QUIT_WORDS = ("quit", "exit")


@dataclass
class Outcome:
    """What one input line did: an answer (already streamed; finish_reason stop, length or
    interrupted), a command's acknowledgement, an error to show, a message refused unanswered, a
    request to quit, or nothing (a blank line)."""

    kind: Literal["answer", "info", "error", "refused", "quit", "nothing"]
    text: str = ""
    finish_reason: str | None = None


class ChatSession:
    """A conversation with one model. `messages` holds every user/assistant turn since the last
    `/clear` and `turn_systems` the system prompt each turn was generated with (what `/save` writes);
    the prompt holds the current system prompt plus the newest whole turns that fit
    `max_prompt_length`, and a turn once dropped for length stays dropped (`notify` hears when)."""

    def __init__(self, model: Any, tokenizer: Any, generation: GenerationArguments | None = None,
                 max_prompt_length: int = 2048, system: str | None = None, bare_quit: bool = False,
                 notify: Callable[[str], None] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation = generation or GenerationArguments()
        self.engine = Engine(model, tokenizer)
        self.max_prompt_length = max_prompt_length
        self.system = system
        self.bare_quit = bare_quit
        self.notify = notify or (lambda text: None)
        self.messages: list[Message] = []
        self.turn_systems: list[str | None] = []
        self.interrupted = False
        self._first_turn = 0  # index (in turns) of the oldest turn still in the prompt

    def conversation(self) -> list[Message]:
        """The whole conversation, the current system prompt first when one is set."""
        head = [{"role": SYSTEM, "content": self.system}] if self.system else []
        return head + self.messages

    def context(self, user_text: str) -> list[Message]:
        """The messages to render for the next reply: system prompt, the newest whole turns that fit
        the token budget together with the new message (data/template.fit_prompt), and the new message."""
        return self._fit(user_text)[1]

    def _fit(self, user_text: str) -> tuple[list[int], list[Message]]:
        """(the prompt's token ids, its messages), as context() describes."""
        try:
            ids, window, first = fit_prompt(self.tokenizer, self.conversation() + [{"role": USER, "content": user_text}],
                                            self.max_prompt_length, first_turn=self._first_turn)
        except PromptTooLong as e:
            raise PromptTooLong(f"{e}: shorten them or raise --max_prompt_length") from None
        if first > self._first_turn:
            dropped = first - self._first_turn
            self.notify(f"note: the oldest {'turn' if dropped == 1 else f'{dropped} turns'} left the model's context "
                        f"(--max_prompt_length {self.max_prompt_length}); {first} of {len(self.messages) // 2} "
                        "turns are out of it now, and /save still keeps them")
        self._first_turn = first
        return ids, window

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None) -> Outcome:
        """Generate (streaming each piece of text to on_text) and record the turn. A reply that
        `interrupt()` stopped is not recorded, so the history holds no half turn."""
        ids, _ = self._fit(user_text)
        pieces: list[str] = []

        def show(index: int, event: Any) -> None:
            if event.text:
                pieces.append(event.text)
                if on_text is not None:
                    on_text(event.text)

        [[completion]] = self.engine.generate([ids], SamplingParams.from_arguments(self.generation), on_event=show,
                                              should_stop=lambda: self.interrupted)
        answer = "".join(pieces) if completion.finish_reason == "cancelled" else completion.text
        if completion.finish_reason == "cancelled":
            return Outcome("answer", answer, "interrupted")
        if not pieces and on_text is not None and answer:  # beam search streams nothing: show it whole
            on_text(answer)
        self.messages += [{"role": USER, "content": user_text}, {"role": ASSISTANT, "content": answer}]
        self.turn_systems.append(self.system)
        return Outcome("answer", answer, completion.finish_reason)

    def interrupt(self) -> None:
        """Stop the reply being generated (safe to call from a signal handler)."""
        self.interrupted = True

    def clear(self) -> None:
        self.messages = []
        self.turn_systems = []
        self._first_turn = 0

    def records(self) -> list[list[Message]]:
        """The conversation as training rows, each reply with the system prompt it was generated with:
        one row per run of turns that shared a system prompt, the turns before the run coming along as
        context (their replies `"loss": false`, so that every reply trains once)."""
        rows: list[list[Message]] = []
        start, turns = 0, len(self.messages) // 2
        for end in range(1, turns + 1):
            if end < turns and self.turn_systems[end] == self.turn_systems[start]:
                continue
            system = self.turn_systems[start]
            head = [{"role": SYSTEM, "content": system}] if system else []
            context = [{**m, LOSS_FLAG: False} if m["role"] == ASSISTANT else m for m in self.messages[:2 * start]]
            rows.append(head + context + self.messages[2 * start:2 * end])
            start = end
        return rows

    def save(self, path: str) -> str:
        """Append the conversation as `{"messages": [...]}` lines (the OpenAI format training reads),
        one per system prompt it was generated with; returns what was written, in words."""
        rows = self.records()
        if not rows:
            raise ValueError("nothing to save yet: the conversation is empty")
        existing = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                existing = f.read()
            if existing and not existing.endswith("\n"):
                existing += "\n"
        lines = "".join(json.dumps({"messages": row}, ensure_ascii=False) + "\n" for row in rows)
        atomic_write_text(path, existing + lines)
        count = sum(map(len, rows))
        if len(rows) == 1:
            return f"saved {count} messages to {path}"
        return f"saved {len(rows)} conversations, one per system prompt used, ({count} messages) to {path}"

    def handle(self, line: str, on_text: Callable[[str], None] | None = None) -> Outcome:
        """Run one input line: a command, or a user message to answer."""
        self.interrupted = False
        text = line.strip()
        if not text:
            return Outcome("nothing")
        if text.startswith("/") and not text.startswith("//"):
            word, _, rest = text.partition(" ")
            return self._command(word.lower(), rest.strip())
        if self.bare_quit and text.lower() in BARE_QUIT_WORDS:
            return Outcome("quit")
        try:
            return self.reply(text.removeprefix("/"), on_text)
        except PromptTooLong as e:
            return Outcome("refused", str(e))

    def _command(self, word: str, rest: str) -> Outcome:
        if word in ("/quit", "/exit"):
            return Outcome("quit")
        if word == "/clear":
            self.clear()
            return Outcome("info", "history cleared")
        if word == "/help":
            return Outcome("info", f"commands: {COMMANDS}")
        if word == "/system":
            self.system = rest or None
            return Outcome("info", "system prompt set" if self.system else "system prompt back to the template's default")
        if word == "/save":
            path = os.path.expanduser(rest)
            if not path:
                return Outcome("error", "usage: /save FILE")
            try:
                return Outcome("info", self.save(path))
            except (OSError, ValueError) as e:
                return Outcome("error", f"/save {path}: {e}")
        return Outcome("error", f"unknown command {word}; commands: {COMMANDS}")
