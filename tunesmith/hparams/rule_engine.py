"""The engine of the rules tables: `Rule`, one row (what it reads, when it is broken, what it says), and
`check_rows`, which raises the error of the first broken row that applies to a run. The tables are the core's
(hparams/rules.py) and each feature's (its rules.py); the helpers their rows share are hparams/rule_helpers.py's.

A row declares what it reads (its roles, and the fields only some commands' dataclasses have, e.g. "data.packing",
which DataArguments lacks and SFTDataArguments has), so a run is checked against exactly the rows it has those for,
and a row needs no guard: a row that reads what it did not declare raises, never skips."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..errors import ConfigError, PathError


@dataclass(frozen=True)
class Rule:
    """One row. `broken(run)` is falsy when the settings are fine; otherwise True, or a dict of values for the
    message's {placeholders} (which may also name any role's fields, e.g. {model.quantization_bit}).

    The row applies to the runs that have all of `roles` and none of `without`. Each is a role ("model": the run has
    a model) or a role's field ("data.packing": the run's data dataclass has a `packing` field; the data of
    `tunesmith score` has none). `broken` reads only those: any field of a role it names that every command's
    dataclass of that role has, and the fields it names. A read of anything else raises AttributeError (a bug in the
    row), so a row is never skipped by accident. A feature's row with `first` is checked before the core's: a
    refusal of what the command cannot do at all, which would make the core's advice on the same settings moot (DPO
    with a prompt-tuning adapter: "DPO cannot train it", not "continue it with --finetuning_type prompt_tuning")."""

    name: str
    roles: tuple[str, ...]
    broken: Callable[[SimpleNamespace], Any]
    message: str
    error: type[Exception] = ConfigError
    without: tuple[str, ...] = ()
    first: bool = False

    def applies(self, roles: Mapping[str, Any]) -> bool:
        """Whether a run of these roles (a role's dataclass by its name) has what the row reads."""
        return all(_has(roles, need) for need in self.roles) and not any(_has(roles, need) for need in self.without)


def _has(roles: Mapping[str, Any], need: str) -> bool:
    """Whether the run has `need`: "ROLE" (given, not None), or "ROLE.FIELD" (a role whose dataclass has FIELD)."""
    role, _, field = need.partition(".")
    config = roles.get(role)
    return config is not None and (not field or hasattr(config, field))


def check_rows(rows: Iterable[Rule], roles: Mapping[str, Any], check_paths: bool = True) -> None:
    """Raise the error of the first broken row, in order, among those that apply to a run of these roles
    (Rule.applies). check_paths=False leaves out the rows about files and folders (for settings read on another
    machine than the run's). A row that reads what it did not declare raises its AttributeError, with the row's
    name."""
    namespace = SimpleNamespace(**roles)
    for rule in rows:
        if not rule.applies(roles):
            continue
        if not check_paths and rule.error is PathError:
            continue
        try:
            found = rule.broken(namespace)
        except AttributeError as e:
            e.add_note(f"in the rule {rule.name!r}, whose roles are {rule.roles}: a field only some commands' "
                       "dataclasses have is named as ROLE.FIELD")
            raise
        if found:
            values = found if isinstance(found, dict) else {}
            raise rule.error(rule.message.format(**roles, **values))
