"""Chat with a model over several rounds, in a terminal or from a pipe. Prompts are rendered by the
same chat-template code that training uses.

    tunesmith chat                                             # the embedded SmolLM2-135M-Instruct
    tunesmith chat --model_name_or_path outputs/sft_demo   # an adapter dir (base from adapter_config.json)
    tunesmith chat --model_name_or_path M --adapter_name_or_path A --do_sample false --max_new_tokens 128
    printf 'Hi!\\nWhat did I just say?\\n' | tunesmith chat --do_sample false --output jsonl > answers.jsonl

Commands start with /: /clear (forget the history; the system prompt stays), /system TEXT (set the
system prompt; `/system` alone: back to the template's default), /save FILE (append the conversation to
FILE as {"messages": [...]} lines, SFT training data; each reply is saved with the system prompt it was
generated with), /quit, /help. Every other line is a message (`//text` sends "/text"). In a terminal,
`quit` or `exit` typed alone leaves too; from a pipe they are messages like any other.

Ctrl-C during a reply stops it and the session goes on (the stopped turn is not kept in the history);
Ctrl-C at the prompt leaves with status 130, Ctrl-D or /quit with status 0. When the history outgrows
--max_prompt_length the oldest whole turns leave the prompt, with a one-line notice.

Only answers go to stdout. In a terminal the banner, the "User:"/"Assistant:" labels and notices are
shown too; from a pipe, labels are left out and everything but answers goes to stderr. `--output
jsonl` writes one JSON object per message instead, {"content": ..., "finish_reason": "stop" | "length"
| "interrupted"} (or {"error": ...} for a message refused unanswered), so that a script can tell where
a multi-line answer ends.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator, Sequence

from ..boundary import entry_point
from ..generation.chat_session import COMMANDS, ChatSession, Outcome
from ..hparams import parse_run
from ..models.loader import load_for_inference


def run(argv: Sequence[str] | None = None) -> None:
    args = parse_run("chat", argv, __doc__)
    model, tokenizer = load_for_inference(args.model)
    interactive = sys.stdin.isatty()
    notes = sys.stdout if interactive else sys.stderr
    session = ChatSession(model, tokenizer, args.generation, args.chat.max_prompt_length, args.chat.system,
                          bare_quit=interactive, notify=lambda text: print(text, file=notes, flush=True))
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())

        print(f"Chatting with {args.model.adapter_name_or_path or args.model.model_name_or_path}.\n"
              f"Commands: {COMMANDS}.\nCtrl-C stops a reply; at the prompt it leaves.", file=notes)
    jsonl = args.chat.output == "jsonl"
    printer = AnswerPrinter(interactive)
    while True:
        try:
            line = input("\nUser: ") if interactive else sys.stdin.readline()
        except EOFError:  # Ctrl-D in a terminal
            print(file=notes)
            break
        except KeyboardInterrupt:  # at the prompt: leave (the boundary says so, with status 130)
            print(file=notes, flush=True)
            raise
        if not line and not interactive:  # end of the piped input
            break
        printer.started = False
        with ctrl_c_stops_the_reply(session):
            outcome = session.handle(line, on_text=None if jsonl else printer)
        if outcome.kind == "quit":
            break
        show(outcome, jsonl, printer, notes)


def show(outcome: Outcome, jsonl: bool, printer: AnswerPrinter, notes) -> None:
    """Print what one line did: answers to stdout (one JSON line each with --output jsonl), the rest
    to the notes stream, errors to stderr."""
    if outcome.kind == "answer" and jsonl:
        print(json.dumps({"content": outcome.text, "finish_reason": outcome.finish_reason}, ensure_ascii=False),
              flush=True)
    elif outcome.kind == "answer":
        print(flush=True)  # ends the streamed answer's line (a stopped one's too)
    elif outcome.kind == "refused" and jsonl:
        print(json.dumps({"error": outcome.text}, ensure_ascii=False), flush=True)
    if outcome.kind in ("error", "refused"):
        print(outcome.text, file=sys.stderr, flush=True)
    elif outcome.kind == "info":
        print(outcome.text, file=notes, flush=True)
    if outcome.finish_reason == "interrupted":
        print("(reply stopped; this turn is not kept. Ctrl-C at the prompt leaves.)", file=notes, flush=True)


@contextlib.contextmanager
def ctrl_c_stops_the_reply(session: ChatSession) -> Iterator[None]:
    """While a line is handled, Ctrl-C (SIGINT) stops the reply instead of ending the program."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: session.interrupt())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
