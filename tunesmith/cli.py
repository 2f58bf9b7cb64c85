"""The `tunesmith` command: `tunesmith COMMAND [RUN_CONFIG.yaml] [--flag value ...]`, one sub-command per feature
command (tunesmith/<feature>/command.py and the like; the stage scripts sft/train.py, reward/train.py, ... run the
same ones). Each sub-command's one-line summary is the first line of its command module's docstring, read without
importing the module, so `tunesmith --help` answers at once."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__

# sub-command -> its feature's command module (each has run(argv) and main = entry_point(run))
COMMANDS = {
    "sft": "tunesmith.sft.command",
    "pt": "tunesmith.pretrain.command",
    "distill": "tunesmith.distill.command",
    "reward": "tunesmith.preference.reward",
    "dpo": "tunesmith.preference.command",
    "score": "tunesmith.preference.score",
    "ppo": "tunesmith.rl.command",
    "eval": "tunesmith.evaluation.command",
    "merge": "tunesmith.merge.command",
    "export": "tunesmith.export.command",
    "chat": "tunesmith.chat.command",
    "serve": "tunesmith.serve.command",
    "vllm-serve": "tunesmith.vllm_serve.command",
    "inspect": "tunesmith.inspect.command",
    "compare": "tunesmith.evaluation.compare",
    "ui": "tunesmith.ui.command",
    "plan": "tunesmith.plan.command",
}
# Earlier names that still work, left out of `tunesmith --help`: the policy evaluation is part of `eval` now.
HIDDEN_COMMANDS = {
    "eval-policy": "tunesmith.rl.evaluate_command",
    "eval-ppo": "tunesmith.rl.evaluate_command",  # its first name
    "eval-rl": "tunesmith.rl.evaluate_command",  # named for GRPO's reward functions
}


def summary(module: str) -> str:
    origin = importlib.util.find_spec(module).origin
    doc = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=[.?!])\s", paragraph, maxsplit=1)[0]  # its first sentence


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(module)}" for name, module in COMMANDS.items()]
    return ("usage: tunesmith COMMAND [RUN_CONFIG.yaml] [--flag value ...]\n\n"
            "Fine-tune a causal LM into a chat model and use it. Commands:\n" + "\n".join(lines) +
            "\n\n`tunesmith COMMAND --help` lists a command's flags. Errors print one line and exit with status 2;"
            "\n--debug (or TUNESMITH_DEBUG=1) adds the traceback. `tunesmith --version` prints the version.")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if args[0] in ("-V", "--version"):
        print(f"tunesmith {__version__}")
        return
    name = args[0].replace("_", "-")
    module = COMMANDS.get(name) or HIDDEN_COMMANDS.get(name)
    if module is None:
        print(f"tunesmith: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"tunesmith {name}", *args[1:]]  # so --help shows the command as it was typed
    importlib.import_module(module).main(args[1:])


if __name__ == "__main__":
    main()
