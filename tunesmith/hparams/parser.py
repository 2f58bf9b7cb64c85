"""One parser for every kind of run: an optional YAML/JSON run config as the first argument, then
`--flag value` overrides, into the stage's dataclasses; old flag spellings mapped to new ones with a
deprecation line; unknown flags and keys refused with a suggestion; then every row of the rules
table (hparams/rules.py) and of the command's feature (e.g. tunesmith/export/rules.py), before any weight loads. `--help` opens with what the stage does and how
to pass a run config, and lists tunesmith's own flags before the Trainer's. A boolean flag given bare
means true (`--disable_dropout`), or takes a value (`--disable_dropout false`, yes/no, 1/0)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import re
import sys
from argparse import SUPPRESS, ArgumentTypeError, RawDescriptionHelpFormatter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from transformers import HfArgumentParser
from transformers import TrainingArguments as HFTrainingArguments
from transformers.hf_argparser import string_to_bool

from ..errors import ConfigError
from ..utils.hub_data import resolve_hub_data
from ..utils.paths import adapter_base_model, adapter_config, is_adapter_dir
from ..utils.threads import warn_about_cpu_threads
from .optimizers import check_optimizer
from .rule_engine import Rule
from .rules import check
from .training_args import resolve_checkpointing, resolve_eval_schedule

logger = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

# Old spelling -> the one flag that now means the same thing in every stage. Accepted, with a
# deprecation line, until DEPRECATED_UNTIL.
DEPRECATED_FLAGS = {
    "adapter": "adapter_name_or_path",
    "base_model": "model_name_or_path",
    "overwrite": "overwrite_output_dir",
    "max_input_tokens": "max_prompt_length",
    "prompts": "data_path",
    "sample": "do_sample",
    "sft": "baseline",
    "ppo": "policy",
    "eval_split_ratio": "val_size",
    "output_jsonl": "output_file",  # score and inspect, now named as every other command's output file
}
DEPRECATED_UNTIL = "0.3"

# Old spelling -> the flag that now carries its meaning, where the old name kept another meaning elsewhere: not
# mapped silently (a DPO config with `gamma` would otherwise mean something else in PPO); refused in one line.
MEANING_MOVED = {
    "gamma": ("simpo_gamma", "SimPO's target margin is --simpo_gamma; --gamma is only PPO's GAE discount"),
    "loss_aggregation": ("loss_type", "token is --loss_type bnpo (or dapo, the default), sequence is --loss_type grpo"),
}

RUN_CONFIG_HELP = (
    "Run config: the first argument may be a YAML or JSON file of `flag: value` lines (see configs/); flags\n"
    "given after it override it. Errors print one line and exit with status 2; --debug (or\n"
    "TUNESMITH_DEBUG=1) adds the traceback."
)


class HelpFormatter(RawDescriptionHelpFormatter):
    """Keeps the description's own line breaks; adds "(default: X)" only where the help text does not
    already say what the default is and there is one."""

    def _get_help_string(self, action: Any) -> str:
        text = action.help or ""
        if action.default in (None, SUPPRESS, [], "") or "default" in text.lower() or action.option_strings == ["-h", "--help"]:
            return text
        return f"{text} (default: {action.default})"


class Parser(HfArgumentParser):
    def __init__(self, dataclass_types: Sequence[type], description: str | None = None, prog: str | None = None):
        prog = prog or os.path.basename(sys.argv[0] or "tunesmith")
        super().__init__(
            list(dataclass_types),
            prog=prog,
            usage=f"{prog} [RUN_CONFIG.yaml] [--flag value ...]",
            description=((description or "").strip() + "\n\n" + RUN_CONFIG_HELP).strip(),
            formatter_class=HelpFormatter,
            allow_abbrev=False,  # a prefix like --learning must not silently mean --learning_rate
        )
        self.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
        self._allow_bare_booleans()

    def _allow_bare_booleans(self) -> None:
        """Every boolean flag works bare (`--disable_dropout` means true), as DeepSpeed-Chat's users type
        them and as HfArgumentParser already parses a plain `bool`: it asks a value of a `bool | None` field
        (None: the stage decides), where argparse then stops with "expected one argument"."""
        for action in self._actions:
            if action.type is string_to_bool and action.nargs is None:
                action.nargs, action.const = "?", True
        for dtype in self.dataclass_types:
            for name, words in getattr(dtype, "also_accepts", {}).items():
                self._option_string_actions[f"--{name}"].type = boolean_or(words)

    def _add_dataclass_arguments(self, dtype: type) -> None:
        if not issubclass(dtype, HFTrainingArguments):
            super()._add_dataclass_arguments(dtype)
            return
        # The fields tunesmith sets or documents first; the Trainer's other ~130 come last.
        hints = get_type_hints(dtype)
        first = set(getattr(dtype, "help_first", ()))
        for klass in dtype.__mro__:  # ours and the subclasses' own fields (SFTTrainingArguments)
            if klass is HFTrainingArguments:
                break
            first |= set(vars(klass).get("__annotations__", {}))
        ours = self.add_argument_group(getattr(dtype, "_argument_group_name", "training"))
        rest = []
        for f in dataclasses.fields(dtype):
            if not f.init or f.name == "debug":  # transformers' --debug (overflow tracing) yields to ours
                continue
            f.type = hints[f.name]
            if f.name in first:
                self._parse_dataclass_field(ours, f)
            else:
                rest.append(f)
        theirs = self.add_argument_group(
            "transformers Trainer options", "The other fields of transformers.TrainingArguments, passed through."
        )
        for f in rest:
            self._parse_dataclass_field(theirs, f)

    @property
    def flags(self) -> set[str]:
        return {s[2:] for s in self._option_string_actions if s.startswith("--")}

    @property
    def defaults(self) -> dict[str, Any]:
        """Each flag's default value (None where the stage decides, or the flag is off)."""
        return {action.dest: action.default for action in self._actions}


def boolean_or(words: tuple[str, ...]) -> Any:
    """The argparse type of a boolean flag that also takes these words (--gradient_checkpointing offload)."""

    def boolean(value: str) -> bool | str:
        if value.lower() in words:
            return value.lower()
        try:
            return string_to_bool(value)
        except ArgumentTypeError:
            raise ArgumentTypeError(f"{value!r}: give true, false, {' or '.join(words)}") from None

    return boolean


class ParsedRun:
    """The parsed dataclasses of one run, by role (run.model, run.data, run.training, ...), in the
    order they were asked for (run.configs, which is what tunesmith_config.json records)."""

    def __init__(self, configs: Sequence[Any]) -> None:
        self.configs = tuple(configs)
        for config in self.configs:
            setattr(self, config.role, config)

    def __iter__(self):
        return iter(self.configs)


def parse_args(dataclass_types: Sequence[type], argv: Sequence[str] | None = None,
               description: str | None = None, check_paths: bool = True, rules: Sequence[Rule] = ()) -> ParsedRun:
    """Parse a command line into the given dataclasses, then apply the rules table and the command's feature's
    `rules` (check_paths=False: all but the rows about files and folders), then replace the Hugging Face Hub datasets
    named as data files by their local files (utils/hub_data.py). `description` (the recipe's docstring) opens
    `--help`."""
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--debug"]
    namespace = parse_namespace(dataclass_types, argv, description)
    eval_note = resolve_eval_schedule(vars(namespace))
    checkpointing_note = resolve_checkpointing(vars(namespace), dataclass_types)
    configs = []
    for dtype in dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        try:
            configs.append(dtype(**{k: v for k, v in vars(namespace).items() if k in keys}))
        except ConfigError:
            raise
        except ValueError as e:  # a library's own check in __post_init__ (e.g. TrainingArguments), on one line
            raise ConfigError(" ".join(str(e).split())) from e
    run = ParsedRun(configs)
    if hasattr(run, "model"):
        resolve_adapter_base(run.model, warn=False)
    check(check_paths, rules, **{config.role: config for config in configs})
    if hasattr(run, "training"):  # --optim: its package, CUDA, and the flags it cannot go with
        check_optimizer(run.training, own_loop=hasattr(run, "ppo"))
    if hasattr(run, "model"):
        warn_if_not_the_recorded_base(run.model)  # after the rules: a refused run gets one message only
    if check_paths:  # a run about to start (not a config read for inspection)
        resolve_hub_data(*configs)  # after every rule: nothing is fetched for a run that is refused
        warn_about_cpu_threads()
        for note in (eval_note, checkpointing_note):
            if note:
                logger.info(note)
    return run


def parse_namespace(dataclass_types: Sequence[type], argv: Sequence[str],
                    description: str | None = None) -> argparse.Namespace:
    """Every field's value as the command line sets it (the run config first, the flags after it winning, old
    spellings renamed), before any dataclass is built, file read or rule applied: what parse_args builds the
    dataclasses from, and what a caller that vets a command line before it runs (the web UI) reads."""
    parser = Parser(dataclass_types, description)
    file_argv: list[str] = []
    if argv and not argv[0].startswith("-"):
        if not argv[0].endswith(CONFIG_SUFFIXES):
            raise ConfigError(f"unexpected argument {argv[0]!r}: the first argument may be a run config "
                              "(.yaml, .yml or .json); everything else goes as --flag value (see --help)")
        file_argv = config_file_to_argv(argv[0], parser.flags, parser.defaults)
        argv = argv[1:]
    namespace, unknown = parser.parse_known_args(args=file_argv + _renamed(argv, parser.flags, "command line"))
    if unknown:
        raise ConfigError(_unknown_message(unknown, parser.flags))
    del namespace.debug  # the boundary's flag, not a dataclass field (TrainingArguments has its own `debug`)
    return namespace


def resolve_adapter_base(model_args: Any, warn: bool = True) -> None:
    """An adapter directory given as the model becomes the adapter on its recorded base; a base left
    out comes from the adapter's record. warn: say so when a base given differs from the record."""
    if model_args.adapter_name_or_path is None and is_adapter_dir(model_args.model_name_or_path):
        model_args.adapter_name_or_path, model_args.model_name_or_path = model_args.model_name_or_path, None
    if is_adapter_dir(model_args.adapter_name_or_path) and model_args.model_name_or_path is None:
        model_args.model_name_or_path = adapter_base_model(model_args.adapter_name_or_path)
    if warn:
        warn_if_not_the_recorded_base(model_args)


def warn_if_not_the_recorded_base(model_args: Any) -> None:
    """A base that differs from the one the adapter's adapter_config.json records is warned about, not
    refused: it may be deliberate (the same weights in another folder)."""
    adapter, base = model_args.adapter_name_or_path, model_args.model_name_or_path
    if not is_adapter_dir(adapter) or not base or is_adapter_dir(base):
        return
    recorded = adapter_config(adapter).get("base_model_name_or_path")
    if recorded and os.path.realpath(base) != os.path.realpath(recorded):
        logger.warning("--model_name_or_path %s is not the base that %s was trained on (%s, in its "
                       "adapter_config.json); go on only if it holds the same weights", base, adapter, recorded)


def _renamed(argv: Sequence[str], flags: set[str], where: str) -> list[str]:
    out = []
    for token in argv:
        name, eq, value = token[2:].partition("=")
        if token.startswith("--") and name not in flags and DEPRECATED_FLAGS.get(name) in flags:
            new = DEPRECATED_FLAGS[name]
            logger.warning("%s: --%s is deprecated, use --%s (the old spelling works until tunesmith %s)",
                           where, name, new, DEPRECATED_UNTIL)
            token = f"--{new}{eq}{value}"
        out.append(token)
    return out


def _suggestion(name: str, flags: set[str], prefix: str = "--") -> str:
    """` (did you mean --flag?)`; prefix "" for a run-config key."""
    close = difflib.get_close_matches(name, sorted(flags), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else " (see --help for the flags)"


def _unknown_message(unknown: list[str], flags: set[str]) -> str:
    first = next((u for u in unknown if u.startswith("-")), unknown[0])
    if not first.startswith("-"):
        return f"unexpected value {first!r}: every value follows its --flag (see --help)"
    name = first.lstrip("-").partition("=")[0]
    return _moved(name, flags, "--") or f"unknown flag --{name}{_suggestion(name, flags)}"


def _moved(name: str, flags: set[str], prefix: str) -> str | None:
    """The line for a flag whose meaning moved to another name in this stage, else None."""
    new, why = MEANING_MOVED.get(name, (None, ""))
    if new not in flags:
        return None
    return f"{prefix}{name} is renamed: use {prefix}{new} ({why})"


def config_file_to_argv(path: str, flags: set[str], defaults: dict[str, Any] | None = None) -> list[str]:
    """A flat YAML/JSON mapping as `--key value` tokens, so that flags given after it win. Unknown keys
    are refused with the file, line and a suggestion. A null (`output_dir: null`, `~`) is the key left out
    where the flag's default is null too (`defaults`), and refused elsewhere: as a token it would be the
    text "None", a folder of that name for a path."""
    if not os.path.isfile(path):
        raise ConfigError(f"run config {path}: no such file")
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text)  # JSON is YAML too; YAML also reports the line of a syntax error
    except UnicodeDecodeError as e:
        raise ConfigError(f"run config {path}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"run config {path}{where}: not valid YAML/JSON: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"run config {path}: must be a mapping of flag names to values, got {type(data).__name__}")
    base = Path(path).resolve().parent
    argv: list[str] = []
    for key, value in data.items():
        key = str(key)
        where = f"run config {path}:{_line_of(text, key)}"
        if key not in flags:
            if DEPRECATED_FLAGS.get(key) not in flags:
                moved = _moved(key, flags, "")
                raise ConfigError(f"{where}: {moved}" if moved
                                  else f"{where}: unknown key `{key}`{_suggestion(key, flags, prefix='')}")
        if isinstance(value, dict):
            raise ConfigError(f"{where}: `{key}` is a mapping; give a file path instead (e.g. a DeepSpeed json).")
        name = key if key in flags else DEPRECATED_FLAGS[key]
        if value is None and (defaults or {}).get(name, "") is None:
            continue
        if value is None or isinstance(value, list) and None in value:
            default = (defaults or {}).get(name)
            raise ConfigError(f"{where}: `{key}` is null: give a value, or leave the key out for its default"
                              + (f" ({default})" if default not in (None, "", []) else ""))
        argv.extend(_renamed([f"--{key}"], flags, where))
        for v in value if isinstance(value, list) else [value]:
            argv.append(_config_value(v, key, base))
    return argv


def _line_of(text: str, key: str) -> int:
    match = re.search(rf"^[ \t]*[\"']?{re.escape(key)}[\"']?\s*:", text, flags=re.M)
    return text.count("\n", 0, match.start()) + 1 if match else 1


# Paths in a run config are relative to the repo root when they exist there, else to the config file.
_PATH_KEYS = {"data_path", "eval_data_path", "deepspeed", "fsdp_config", "chat_template"}


def _config_value(value: Any, key: str, base: Path) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if key in _PATH_KEYS:  # each of a comma-separated list (data_path: a.jsonl,b.jsonl) on its own
        return ",".join(_config_path(part.strip(), base) for part in text.split(",")) if "," in text else _config_path(text, base)
    return text


def _config_path(text: str, base: Path) -> str:
    if not os.path.isabs(text) and not os.path.exists(text) and (base / text).exists():
        return str(base / text)
    return text
