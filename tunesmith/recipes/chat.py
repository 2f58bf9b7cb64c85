"""Chat with a model over several rounds, in a terminal or from a pipe. Prompts are rendered by the
same chat-template code that training uses.

    tunesmith chat                                             # the embedded SmolLM2-135M-Instruct
    python chat/cli.py --model_name_or_path outputs/sft_demo   # an adapter dir (base from adapter_config.json)
    python chat/cli.py --model_name_or_path M --adapter_name_or_path A --do_sample false --max_new_tokens 128
    printf 'Hi!\\nWhat did I just say?\\n' | python chat/cli.py --do_sample false > answers.txt

Commands (typed as a message): clear (forget the history; the system prompt stays), /system TEXT (set
the system prompt; `/system` alone: back to the template's default), /save FILE (append the conversation
to FILE as one {"messages": [...]} line, SFT training data), quit, exit, stop (or Ctrl-D / Ctrl-C).

Only answers go to stdout. In a terminal the banner, the "User:"/"Assistant:" labels and command
acknowledgements are shown too; from a pipe, labels are left out and everything but answers goes to
stderr, so `... | python chat/cli.py > answers.txt` collects one answer per line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..boundary import entry_point
from ..chat.engine import COMMANDS, ChatSession
from ..hparams import parse_run
from ..models.loader import load_for_inference


def run(argv: Sequence[str] | None = None) -> None:
    args = parse_run("chat", argv, __doc__)
    model, tokenizer = load_for_inference(args.model)
    session = ChatSession(model, tokenizer, args.generation, args.chat.max_prompt_length, args.chat.system)

    interactive = sys.stdin.isatty()
    notes = sys.stdout if interactive else sys.stderr
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())

        print(f"Chatting with {args.model.adapter_name_or_path or args.model.model_name_or_path}.\n"
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



main = entry_point(run)
