"""The command lines the page runs: a form's values as the argument list of `tunesmith <stage>` (a list,
never a shell string; `shlex.join` only to show it), and every path the page takes confined to the
folders the UI was given (--root and --data_dir, plus the embedded default model's folder)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args, get_origin, get_type_hints

from ..errors import ConfigError, PathError
from ..hparams import RUN_ARGUMENTS
from ..hparams.finetuning_args import LORA_INITIALISATIONS
from ..hparams.optimizers import OPTIMIZERS
from ..hparams.parser import DEPRECATED_FLAGS

# The Train tab's stages: the command each runs, and the flags it adds (GRPO is `tunesmith ppo` with
# group-relative advantages, as configs/grpo_demo.yaml runs it).
STAGES = {
    "sft": ("sft", ()),
    "pt": ("pt", ()),  # continued pre-training: the dataset is raw text (.txt, or rows with a text field)
    "reward": ("reward", ()),
    "dpo": ("dpo", ()),
    "ppo": ("ppo", ()),
    "grpo": ("ppo", ("--advantage", "grpo")),
    "distill": ("distill", ()),  # the teacher in the advanced flags: --teacher_model_name_or_path DIR
}
METHODS = ("lora", "qlora", "full")
# The flags the form writes, by the box that writes them (--advantage: the Stage grpo).
FORM_FLAGS = {"--model_name_or_path": "Model", "--data_path": "Dataset", "--output_dir": "Output folder",
              "--finetuning_type": "Method", "--quantization_bit": "Method", "--max_steps": "Max steps",
              "--learning_rate": "Learning rate", "--num_train_epochs": "Epochs", "--lora_r": "LoRA rank",
              "--advantage": "Stage", "--use_dora": "DoRA", "--use_rslora": "rsLoRA",
              "--init_lora_weights": "LoRA init", "--loraplus_lr_ratio": "LoRA+ ratio", "--qat": "QAT",
              "--optim": "Optimizer"}
# The LoRA init box's choices: empty (the CLI's default, LoRA's own "true") and the CLI's other initialisations;
# pissa_niter_N goes in the Advanced flags.
LORA_INITS = ("", *(name for name in LORA_INITIALISATIONS if name != "true"))


def flag_choices(command: str, role: str, name: str) -> tuple[str, ...]:
    """The values `tunesmith COMMAND --NAME` takes: the Literal of the field in the command's dataclass of that role,
    read through RUN_ARGUMENTS as the CLI's parser reads it (a feature imports no other, so the page never imports
    the merge or export feature; it lists every kind's flags the same way, ui/run_limits.py)."""
    kind = next(kind for kind in RUN_ARGUMENTS[command] if getattr(kind, "role", None) == role)
    hint = get_type_hints(kind)[name]
    return get_args(next(h for h in (hint, *get_args(hint)) if get_origin(h) is Literal))


# The Export tab's choices: `tunesmith merge --method`'s values and `tunesmith export --dtype`'s GGUF tensor types.
MERGE_METHODS = flag_choices("merge", "merge", "method")
GGUF_DTYPES = flag_choices("export", "model", "dtype")
# The QAT box's schemes: --qat's values (sft's, the same dataclass as pt's).
QAT_SCHEMES = flag_choices("sft", "qat", "qat")
# The Optimizer box's choices: empty (the CLI's default) and every --optim value (docs/optimizers.md)
OPTIMS = ("", *OPTIMIZERS)
EMBEDDED = ""  # the Model box left empty: the CLI's default, the embedded SmolLM2-135M-Instruct


@dataclass
class TrainForm:
    """The Train tab's fields. Empty ones are left out, so the CLI's defaults apply."""

    stage: str = "sft"
    model: str = EMBEDDED
    dataset: str = ""
    max_steps: int | None = None
    method: str = "lora"
    learning_rate: float | None = None
    epochs: float | None = None
    lora_rank: int | None = None
    output_dir: str = ""
    advanced: str = ""
    config: str = ""  # a run config (YAML/JSON) read first, as `tunesmith sft CONFIG.yaml --flag ...` reads it
    # The LoRA variants (flags of the same names); off / empty: the CLI's defaults.
    use_dora: bool = False
    use_rslora: bool = False
    init_lora_weights: str = ""
    loraplus_lr_ratio: float | None = None
    qat: str = ""  # --qat's scheme; empty: no quantization-aware training
    optim: str = ""  # --optim; empty: the CLI's default


def tunesmith_argv(command: str, flags: Sequence[str]) -> list[str]:
    """The process to start: this interpreter running `python -m tunesmith COMMAND FLAGS`."""
    return [sys.executable, "-m", "tunesmith", command, *flags]


def shown(argv: Sequence[str]) -> str:
    """The command line as a user types it (`tunesmith sft ...`), quoted for a POSIX shell."""
    args = list(argv)
    if args[1:3] == ["-m", "tunesmith"]:
        args = ["tunesmith", *args[3:]]
    return shlex.join(args)


def advanced_flags(text: str) -> list[str]:
    """The "advanced" box: any other `--flag value` pairs, split as a shell would split them (the result is
    an argument list; nothing runs through a shell)."""
    try:
        tokens = shlex.split(text or "")
    except ValueError as e:
        raise ConfigError(f"advanced flags: {e} (quote values as in a shell)") from None
    if tokens and not tokens[0].startswith("--"):
        raise ConfigError(f"advanced flags: {tokens[0]!r} is not a --flag; give `--flag value` pairs")
    return tokens


def flag_names(tokens: Sequence[str]) -> set[str]:
    """The `--flag` names among argument tokens (`--flag=value` too), old spellings as the names they stand for."""
    names = {token[2:].partition("=")[0] for token in tokens if token.startswith("--")}
    return {f"--{DEPRECATED_FLAGS.get(name, name)}" for name in names}


def train_flags(form: TrainForm) -> tuple[str, list[str]]:
    """(command, flags) for the Train tab's form."""
    if form.stage not in STAGES:
        raise ConfigError(f"Stage {form.stage!r} is not one of {', '.join(STAGES)}")
    if form.method not in METHODS:
        raise ConfigError(f"method {form.method!r} is not one of {', '.join(METHODS)}")
    command, preset = STAGES[form.stage]
    flags = ([form.config.strip()] if form.config and form.config.strip() else []) + list(preset)
    if form.model and form.model.strip():
        flags += ["--model_name_or_path", form.model.strip()]
    if form.dataset and form.dataset.strip():
        flags += ["--data_path", form.dataset.strip()]
    if form.output_dir and form.output_dir.strip():
        flags += ["--output_dir", form.output_dir.strip()]
    if form.method == "full":
        flags += ["--finetuning_type", "full"]
    elif form.method == "qlora":  # LoRA (the CLI's default) on a base loaded in 4 bits
        flags += ["--quantization_bit", "4"]
    for flag, value in (("--max_steps", form.max_steps), ("--learning_rate", form.learning_rate),
                        ("--num_train_epochs", form.epochs), ("--lora_r", form.lora_rank)):
        if value not in (None, "", 0):  # empty (a number box shows 0): the CLI's default
            flags += [flag, _number(value)]
    # Passed whatever the Method: with --finetuning_type full the CLI refuses a LoRA variant in one line.
    flags += [flag for flag, on in (("--use_dora", form.use_dora), ("--use_rslora", form.use_rslora)) if on]
    if form.init_lora_weights and form.init_lora_weights.strip():
        flags += ["--init_lora_weights", form.init_lora_weights.strip()]
    if form.loraplus_lr_ratio not in (None, "", 0):
        flags += ["--loraplus_lr_ratio", _number(form.loraplus_lr_ratio)]
    if form.qat and form.qat.strip():
        flags += ["--qat", form.qat.strip()]
    if form.optim and form.optim.strip():
        flags += ["--optim", form.optim.strip()]
    advanced = advanced_flags(form.advanced)
    twice = sorted(flag_names(flags) & flag_names(advanced))
    if twice:  # the CLI takes the last value: the Advanced one would silently replace the form's, checked one
        raise ConfigError(f"advanced flags: {twice[0]} is set by the form's {FORM_FLAGS.get(twice[0], 'Stage')} "
                          "box; change it there, not in the advanced flags too")
    return command, flags + advanced


def _number(value: float | int | str) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


class Confinement:
    """The folders the page may touch: it reads from --root, the --data_dir folders and the embedded model's
    folder (`extra`), and writes under --root only. Paths outside them are refused in one line."""

    def __init__(self, root: str, data_dirs: Iterable[str] = (), extra: Iterable[str] = ()) -> None:
        self.root = os.path.realpath(root)
        self.allowed = [self.root, *(os.path.realpath(d) for d in (*data_dirs, *extra))]

    def check(self, path: str, what: str = "path") -> str:
        """A path to read, resolved against the current folder (links followed), when it lies under an allowed
        folder."""
        if not path or not path.strip():
            raise PathError(f"{what}: empty; give a path under {self.describe()}")
        if not _inside(path.strip(), self.allowed):
            raise PathError(f"{what} {path.strip()}: outside the folders this UI may use ({self.describe()}); "
                            "move it there or start `tunesmith ui` with --root / --data_dir naming its folder")
        return path.strip()

    def under_root(self, name: str, what: str = "output folder") -> str:
        """A path to write: a bare name is taken under --root; any other path must lie under --root."""
        name = name.strip() if name else ""
        if name and not os.path.isabs(name) and not name.startswith(("./", "../")) and os.sep not in name.strip("/"):
            name = os.path.join(self.root, name)
        if not name or not _inside(name, [self.root]):
            raise PathError(f"{what} {name}: outside --root ({self.root}), the one folder this UI writes to; "
                            "give a name or a path under it")
        return name

    def describe(self) -> str:
        return ", ".join(self.allowed)


def _inside(path: str, folders: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == f or real.startswith(f.rstrip(os.sep) + os.sep) for f in folders)
