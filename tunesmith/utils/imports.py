"""Functions a user names on the command line (`--reward_funcs`, `--tool_funcs`): `package.module:function`,
imported and checked, each mistake a ConfigError naming the flag, the spec and what to do."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

logger = logging.getLogger(__name__)

# Modules of shipped functions that moved: their old names (in run configs written before) still import, with a
# warning. tunesmith/ppo became the feature package tunesmith/rl, its reward functions the core's (2026-11-28).
MOVED_MODULES = {"tunesmith.ppo.tool_funcs": "tunesmith.rl.tool_funcs",
                 "tunesmith.ppo.reward_funcs": "tunesmith.data.reward_funcs"}


def import_function(spec: str, flag: str, default_module: str | None = None) -> Callable[..., Any]:
    """The function `spec` names: `package.module:function`, or a bare name looked up in `default_module` (when
    there is one). The error names `--flag spec` and, for a missing name, the module's public functions."""
    module_name, colon, name = spec.rpartition(":")
    if not colon and default_module:
        module_name = default_module
    where = f"--{flag} {spec}"
    if not name or not module_name:
        raise ConfigError(f"{where}: expected package.module:function")
    if module_name in MOVED_MODULES:
        logger.warning("%s: %s is now %s; write that name (the old one will stop working in a later release)",
                       where, module_name, MOVED_MODULES[module_name])
        module_name = MOVED_MODULES[module_name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import {module_name} ({e}); is its folder on PYTHONPATH?") from None
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"{where}: {module_name} has no function {name!r} (it has: {', '.join(public) or 'none'})")
    if not callable(fn):
        raise ConfigError(f"{where}: {module_name}.{name} is a {type(fn).__name__}, not a function")
    return fn
