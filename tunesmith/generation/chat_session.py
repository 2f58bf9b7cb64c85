"""Multi-round chat without a terminal: the history, the token budget it is cut to, the commands,
and streamed generation (the one engine, engine.py) that a Ctrl-C can stop. `tunesmith chat` (chat/command.py) is a
read-print loop around `ChatSession.handle`, and the web UI's Chat tab (ui/chat.py) streams a reply from it: a
conversation over the one engine, kept here in the core so that the two features share it without importing each
other.

Prompts are rendered by `encode_prompt`, the same chat-template code that training uses, so a model
sees at chat time exactly the layout it was trained on."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..constants import ASSISTANT, LOSS_FLAG, SYSTEM, USER
from ..data.formats import Message
from ..data.images import image_part, open_image, resolve_reference
from ..data.template import PromptTooLong, fit_prompt
from ..errors import DataError, PathError
from ..families import is_vision_language
from ..hparams import GenerationArguments
from ..utils.io import atomic_write_text
from .engine import Engine
from .sampling import SamplingParams

COMMANDS = ("/clear (forget the history; the system prompt stays), /system TEXT (set the system prompt; /system "
            "alone: the template's default), /image PATH (show a picture with the next message; a vision-language "
            "model only), /save FILE (append the conversation to FILE as training data), /quit, /help; a line "
            "starting with // is a message that starts with /")
# A word of a message that names one of these existing files is a picture shown with it (a vision-language model).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
# Where a session's commands may touch files: given a path and "read" (/image, a picture a message names) or
# "write" (/save), the path to use, or a PathError saying why not. The terminal's chat has none (anywhere its user
# may); the web UI's confines them to its folders.
PathCheck = Callable[[str, Literal["read", "write"]], str]
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
                 notify: Callable[[str], None] | None = None, check_path: PathCheck | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation = generation or GenerationArguments()
        self.engine = Engine(model, tokenizer)
        self.max_prompt_length = max_prompt_length
        self.system = system
        self.bare_quit = bare_quit
        self.notify = notify or (lambda text: None)
        self.check_path = check_path
        self.messages: list[Message] = []
        self.turn_systems: list[str | None] = []
        self.interrupted = False
        self._first_turn = 0  # index (in turns) of the oldest turn still in the prompt
        self.pending_images: list[str] = []  # /image pictures for the next message

    def conversation(self) -> list[Message]:
        """The whole conversation, the current system prompt first when one is set."""
        head = [{"role": SYSTEM, "content": self.system}] if self.system else []
        return head + self.messages

    def context(self, user_text: str | list[dict]) -> list[Message]:
        """The messages to render for the next reply: system prompt, the newest whole turns that fit
        the token budget together with the new message (data/template.fit_prompt), and the new message."""
        return self._fit(user_text)[1]

    def _fit(self, user_text: str | list[dict]) -> tuple[list[int], list[Message]]:
        """(the prompt's token ids, its messages), as context() describes. The new message's content is its text,
        or a list of its pictures and its text."""
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

    def reply(self, user_text: str | list[dict], on_text: Callable[[str], None] | None = None) -> Outcome:
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
            return self.reply(self._with_pictures(text.removeprefix("/")), on_text)
        except (PromptTooLong, DataError) as e:
            return Outcome("refused", str(e))

    def _with_pictures(self, text: str) -> str | list[dict]:
        """The message's content: its text, or for a vision-language model the pictures given with /image and
        those its words name (existing image files, taken out of the text), then the text."""
        if not is_vision_language(self.tokenizer):
            return text
        words = text.split()
        named = [w for w in words if w.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.expanduser(w))
                 and self._may_read(os.path.expanduser(w))]  # a file it may not read stays a word
        pictures = self.pending_images + [resolve_reference(w, Path.cwd()) for w in named]
        self.pending_images = []
        if not pictures:
            return text
        rest = " ".join(w for w in words if w not in named) if named else text
        return [*map(image_part, pictures), *([{"type": "text", "text": rest}] if rest else [])]

    def _may_read(self, path: str) -> bool:
        try:
            return not self.check_path or bool(self.check_path(path, "read"))
        except PathError:
            return False

    def _attach(self, path: str) -> Outcome:
        if not is_vision_language(self.tokenizer):
            return Outcome("error", "/image: this model reads text only (its folder has no image processor)")
        if not path:
            return Outcome("error", "usage: /image PATH (a picture shown with your next message)")
        try:
            ref = resolve_reference(os.path.expanduser(path), Path.cwd())
            if self.check_path and not ref.startswith("data:"):
                ref = self.check_path(ref, "read")
            open_image(ref)  # a picture that cannot be read is refused now, not at the next message
        except PathError as e:  # the path check's own line names the command
            return Outcome("error", str(e))
        except ValueError as e:  # DataError too
            return Outcome("error", f"/image {path}: {e}")
        self.pending_images.append(ref)
        count = len(self.pending_images)
        return Outcome("info", f"{count} picture{'s' if count > 1 else ''} will be shown with your next message")

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
        if word == "/image":
            return self._attach(rest)
        if word == "/save":
            path = os.path.expanduser(rest)
            if not path:
                return Outcome("error", "usage: /save FILE")
            try:
                return Outcome("info", self.save(self.check_path(path, "write") if self.check_path else path))
            except PathError as e:
                return Outcome("error", str(e))
            except (OSError, ValueError) as e:
                return Outcome("error", f"/save {path}: {e}")
        return Outcome("error", f"unknown command {word}; commands: {COMMANDS}")
