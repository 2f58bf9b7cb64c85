"""What a run started from the page may set, whichever of the Run config, the form and the Advanced flags sets
it. The command line is read as the CLI will read it (hparams.parser.parse_namespace: the run config first, later
flags winning, old spellings renamed), and the value that wins is checked, field by field over the stage's own
dataclasses, so that a flag a new release adds falls under the same rules:

- a path (a field named `*_path`, `*_dir`, `*_file`, `*_config`, `*checkpoint`, `deepspeed`, `chat_template`
  or `reward_model`, or any string naming an existing file) is read from the UI's folders; an output (`output_*`)
  is written under --root only;
- code that is not tunesmith's (`--trust_remote_code`, and any value naming a function to import,
  `package.module:function`, as --reward_funcs and --tool_funcs take) runs only under `tunesmith ui --allow_code`;
- publishing (`--push_to_hub`) is left to a shell.

Nothing is read before it is checked: no dataclass is built (TrainingArguments reads a --deepspeed file as it is
built) and no rule applied until the command runs in its own process."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

from ..data.template import BUILTIN_TEMPLATES
from ..errors import ConfigError
from ..hparams import RUN_ARGUMENTS
from ..hparams.parser import parse_namespace
from .command_lines import Confinement

# `reward_model` by name: other fields ending in _model are not paths (--metric_for_best_model eval_loss)
PATH_FIELD = re.compile(r"(_path|_dir|_file|_config|checkpoint)$|^(deepspeed|chat_template|reward_model)$")
OUTPUT_FIELD = re.compile(r"^output_")
# `package.module:function`, the form utils/imports.import_function imports (a bare name is one tunesmith ships).
IMPORT_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
TRUSTS_REMOTE_CODE = "trust_remote_code"
PUBLISHES = ("push_to_hub",)


def check_run(command: str, flags: Sequence[str], confinement: Confinement, allow_code: bool = False) -> None:
    """Refuse, in one line, a `tunesmith COMMAND FLAGS` whose resolved settings reach outside the UI's folders or
    run code that is not tunesmith's (unless allow_code)."""
    namespace = vars(parse_namespace(RUN_ARGUMENTS[command], list(flags)))
    for dtype in RUN_ARGUMENTS[command]:
        for field in dataclasses.fields(dtype):
            if field.init and field.name in namespace and namespace[field.name] != _default(field):
                _check_value(field.name, namespace[field.name], confinement, allow_code)


def _check_value(name: str, value: Any, confinement: Confinement, allow_code: bool) -> None:
    flag = f"--{name}"
    if name == TRUSTS_REMOTE_CODE and value and not allow_code:
        raise ConfigError(f"{flag} runs the Python code that comes with a model; this page runs none: start "
                          "`tunesmith ui --allow_code` to allow it, or run the command from a shell")
    if name in PUBLISHES and value:
        raise ConfigError(f"{flag} publishes the run; the page does not: run the command from a shell")
    strings = [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] \
        if isinstance(value, list | tuple) else []
    for part in (p.strip() for text in strings for p in text.split(",") if p.strip()):  # data_path: a,b
        if IMPORT_SPEC.match(part) and not allow_code:
            module, _, function = part.partition(":")
            raise ConfigError(f"{flag} {part} imports {module} to call its {function}; this page runs only "
                              "tunesmith's own functions (bare names): start `tunesmith ui --allow_code` to allow it")
        if OUTPUT_FIELD.match(name):
            confinement.under_root(part, flag)
        elif PATH_FIELD.search(name) and not (name == "chat_template" and part in BUILTIN_TEMPLATES) \
                and not (name.endswith("_config") and part.startswith("{")):  # inline JSON, not a file
            confinement.check(part, flag)
        elif not PATH_FIELD.search(name) and os.path.exists(part):  # a path under another name is read too
            confinement.check(part, flag)


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default
