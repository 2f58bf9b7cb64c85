"""The rows of `tunesmith ui`: settings that cannot work, refused in one line after parsing and before the page is
built (the parser checks them for this command only). What a run started from the page may set is run_limits.py's."""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import PathError
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import problem_values
from ..utils.network import LOOPBACK_HOSTS


def _root_is_a_file(a: Any) -> dict | None:
    """{"problem"} when --root is a file, not a folder (a missing one is created)."""
    return problem_values("is a file, not a directory") if os.path.isfile(a.ui.root) else None


RULES: list[Rule] = [
    Rule("ui_port", ("ui",), lambda a: not 1 <= a.ui.port <= 65535, "--port must be in 1..65535 (got {ui.port})."),
    Rule("ui_auth_form", ("ui",), lambda a: a.ui.auth is not None and not re.fullmatch(r"[^:]+:.+", a.ui.auth),
         "--auth must be user:password, both non-empty (got one without a user or a password)."),
    Rule("ui_auth_needed", ("ui",), lambda a: a.ui.host not in LOOPBACK_HOSTS and not a.ui.auth,
         "--host {ui.host} shows the page, and the commands it runs, to every machine that can reach this one: "
         "give --auth user:password too, or keep the default --host 127.0.0.1."),
    Rule("ui_root", ("ui",), _root_is_a_file,
         "--root {ui.root} {problem}: give the folder of runs (it is created when missing).", PathError),
]
