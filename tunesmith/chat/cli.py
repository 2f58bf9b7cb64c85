"""The chat command line: load -> loop (read a line, let ChatSession handle it, print). See
chat/cli.py for usage.

Only answers go to stdout. In a terminal the banner, the "User:"/"Assistant:" labels and command
acknowledgements are shown too; from a pipe, labels are left out and everything but answers goes to
stderr, so `... | python chat/cli.py > answers.txt` collects one answer per line."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..config import parse_args
from ..models.loader import inference_model_args, load_for_inference
from ..utils.logging import setup_logging
from .engine import COMMANDS, ChatSession, GenerationArguments


@dataclass
class ChatArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A model directory (base or merged), or a LoRA adapter directory (its base is read from "
                  "adapter_config.json). Default: the embedded SmolLM2-135M-Instruct."},
    )
    adapter: str | None = field(default=None, metadata={"help": "A LoRA adapter to put on top of the model."})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "Weight dtype. auto: bfloat16 on a GPU that supports it, float32 otherwise."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "A Jinja chat-template file or built-in name (chatml), for a model that ships none."},
    )
    system: str | None = field(
        default=None, metadata={"help": "System prompt to start with (default: the chat template's own, if any)."}
    )
    max_input_tokens: int = field(
        default=2048,
        metadata={"help": "Longest prompt in tokens (system prompt + history + new message); the oldest whole "
                  "turns are dropped to fit."},
    )


def main(argv: Sequence[str] | None = None) -> None:
    setup_logging()
    chat_args, generation_args = parse_args((ChatArguments, GenerationArguments), argv)
    model_args = inference_model_args(chat_args.model_name_or_path, chat_args.adapter,
                                      dtype=chat_args.dtype, chat_template=chat_args.chat_template)
    model, tokenizer = load_for_inference(model_args)
    session = ChatSession(model, tokenizer, generation_args, chat_args.max_input_tokens, chat_args.system)

    interactive = sys.stdin.isatty()
    notes = sys.stdout if interactive else sys.stderr
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())

        print(f"Chatting with {model_args.adapter_name_or_path or model_args.model_name_or_path}.\n"
              f"Commands: {COMMANDS}.", file=notes)
    printer = AnswerPrinter(interactive)
    try:
        while True:
            line = input("\nUser: ") if interactive else sys.stdin.readline()
            if not line and not interactive:  # EOF (in a terminal, Ctrl-D raises EOFError instead)
                break
            printer.started = False
            outcome = session.handle(line, on_text=printer)
            if outcome.kind == "quit":
                break
            if outcome.kind == "answer":
                print(flush=True)
            elif outcome.kind in ("info", "error"):
                print(outcome.text, file=notes if outcome.kind == "info" else sys.stderr, flush=True)
    except (EOFError, KeyboardInterrupt):
        # End a half-streamed answer's line, so stdout still holds whole lines.
        print(file=sys.stdout if printer.started else notes, flush=True)


class AnswerPrinter:
    """Writes streamed text to stdout, after an "Assistant:" label in a terminal."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.started = False

    def __call__(self, text: str) -> None:
        if self.interactive and not self.started:
            sys.stdout.write("Assistant: ")
        self.started = True
        sys.stdout.write(text)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
