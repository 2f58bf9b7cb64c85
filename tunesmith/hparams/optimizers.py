"""Every `--optim` value transformers' Trainer takes (its OptimizerNames), with what each needs to run: the package
its handler imports (transformers' trainer_optimizer.py), CUDA where the package's code calls it unconditionally,
the flags it cannot be combined with. `check_optimizer` refuses a run that cannot work in one line, right after
parsing and before any weight loads, where transformers would fail later: after the model loads (a missing
package), or at the first step (CUDA calls in galore_torch's 8-bit and lomo_optim's AdaLomo).

Checked against transformers 5.24, bitsandbytes 0.50, galore-torch 1.0, apollo-torch 1.0.3, lomo-optim 0.1.1,
schedulefree 1.4.1, grokadamw 0.1.2, torch-optimi 0.3.3 (docs/optimizers.md; tests/core/train/test_optimizers.py trains two
steps with each that runs on a CPU)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from ..constants import MUON
from ..distributed import fsdp_requested
from ..errors import ConfigError
from ..utils.hardware import trains_on_cpu

EXTRA = "pip install 'tunesmith[optimizers]'"


@dataclass(frozen=True)
class Needs:
    """What one optimizer needs. package: its import name (pip: what to install, when the names differ);
    cuda: why it cannot run on a CPU; never: why it cannot run with this transformers at all; low_rank: GaLore and
    APOLLO project the weights that --optim_target_modules names; per_weight: an optimizer per weight, stepped in
    the backward pass (the layer-wise variants, LOMO), so no accumulation and no DeepSpeed or FSDP."""

    package: str | None = None
    pip: str | None = None
    min_version: str | None = None
    cuda: str | None = None
    never: str | None = None
    low_rank: bool = False
    per_weight: bool = False


def _bnb(paged_ademamix: bool = False) -> Needs:
    # bitsandbytes 0.50 runs its 8-bit and 32-bit optimizers on CPU, and falls back to unpaged state there for
    # AdamW, Lion and RMSprop; AdEMAMix's own state buffer has no CPU fallback and asks CUDA for managed memory
    # for every tensor of 100k elements or more.
    return Needs(package="bitsandbytes", cuda="bitsandbytes' paged AdEMAMix allocates CUDA managed memory (no CPU "
                 "fallback): use ademamix or ademamix_8bit, which paging only differs from on a GPU"
                 if paged_ademamix else None)


_GALORE = Needs(package="galore_torch", pip="galore-torch", low_rank=True)
_GALORE_8BIT = Needs(package="galore_torch", pip="galore-torch", low_rank=True,
                     cuda="galore_torch's GaLoreAdamW8bit calls torch.cuda.synchronize() at every step")
_APOLLO = Needs(package="apollo_torch", pip="apollo-torch", low_rank=True)
_SCHEDULE_FREE = Needs(package="schedulefree")

OPTIMIZERS: dict[str, Needs] = {
    "adamw_torch": Needs(),
    "adamw_torch_fused": Needs(),
    # tunesmith trains on CPUs and CUDA GPUs: these two are for other accelerators.
    "adamw_torch_xla": Needs(package="torch_xla", never="torch_xla's AdamW is for TPUs (XLA devices), which "
                             "tunesmith does not train on: use adamw_torch_fused"),
    "adamw_torch_npu_fused": Needs(package="torch_npu", never="torch_npu's fused AdamW is for Ascend NPUs, which "
                                   "tunesmith does not train on: use adamw_torch_fused"),
    "adafactor": Needs(),
    "adamw_anyprecision": Needs(package="torchdistx",
                                pip="torchdistx (not on PyPI: build it from github.com/pytorch/torchdistx)"),
    "adamw_torch_4bit": Needs(package="torchao", min_version="0.4.0"),
    "adamw_torch_8bit": Needs(package="torchao", min_version="0.4.0"),
    "ademamix": _bnb(),
    "sgd": Needs(),
    "adagrad": Needs(),
    "adamw_bnb_8bit": _bnb(),
    "adamw_8bit": _bnb(),
    "ademamix_8bit": _bnb(),
    "lion_8bit": _bnb(),
    "lion_32bit": _bnb(),
    "paged_adamw_32bit": _bnb(),
    "paged_adamw_8bit": _bnb(),
    "paged_ademamix_32bit": _bnb(paged_ademamix=True),
    "paged_ademamix_8bit": _bnb(paged_ademamix=True),
    "paged_lion_32bit": _bnb(),
    "paged_lion_8bit": _bnb(),
    "rmsprop": Needs(),
    "rmsprop_bnb": _bnb(),
    "rmsprop_bnb_8bit": _bnb(),
    "rmsprop_bnb_32bit": _bnb(),
    "galore_adamw": _GALORE,
    "galore_adamw_8bit": _GALORE_8BIT,
    "galore_adafactor": _GALORE,
    "galore_adamw_layerwise": Needs(package="galore_torch", pip="galore-torch", low_rank=True, per_weight=True),
    "galore_adamw_8bit_layerwise": Needs(package="galore_torch", pip="galore-torch", low_rank=True, per_weight=True,
                                         cuda=_GALORE_8BIT.cuda),
    # transformers builds the layer-wise Adafactors before it turns relative_step off (only the plain
    # galore_adafactor gets that), and GaLoreAdafactor refuses a learning rate with relative_step on.
    "galore_adafactor_layerwise": Needs(package="galore_torch", pip="galore-torch", low_rank=True, per_weight=True,
                                        never="transformers builds GaLore's layer-wise Adafactor with relative_step=True "
                                        "beside a learning rate, which GaLoreAdafactor refuses: use galore_adafactor "
                                        "or galore_adamw_layerwise"),
    "lomo": Needs(package="lomo_optim", pip="lomo-optim", per_weight=True),
    "adalomo": Needs(package="lomo_optim", pip="lomo-optim", per_weight=True,
                     cuda="lomo_optim's AdaLomo creates its state with .cuda()"),
    "grokadamw": Needs(package="grokadamw"),
    "schedule_free_radam": Needs(package="schedulefree", min_version="1.4.0"),
    "schedule_free_adamw": _SCHEDULE_FREE,
    "schedule_free_sgd": _SCHEDULE_FREE,
    "apollo_adamw": _APOLLO,
    "apollo_adamw_layerwise": Needs(package="apollo_torch", pip="apollo-torch", low_rank=True, per_weight=True),
    "stable_adamw": Needs(package="optimi", pip="torch-optimi"),
    # tunesmith's own (train/muon.py): torch.optim.Muon + AdamW; --deepspeed is refused by a rule (hparams/rules.py)
    MUON: Needs(),
}

# torch.optim.Muon's settings that `--optim muon --optim_args k=v,...` may change, with their types
MUON_ARGS: dict[str, type] = {"momentum": float, "nesterov": bool, "ns_steps": int, "eps": float, "adjust_lr_fn": str}
ADJUST_LR_FNS = ("match_rms_adamw", "original")


def muon_args(optim_args: str | None) -> dict[str, Any]:
    """torch.optim.Muon's keyword arguments from --optim_args (ConfigError naming the key or value that is wrong)."""
    parsed: dict[str, Any] = {}
    for item in (optim_args or "").replace(" ", "").split(","):
        if not item:
            continue
        key, _, text = item.partition("=")
        if key not in MUON_ARGS:
            raise ConfigError(f"--optim_args {key}: --optim muon takes {', '.join(MUON_ARGS)} (torch.optim.Muon's "
                              "settings); the AdamW half reads --adam_beta1, --adam_beta2 and --adam_epsilon")
        kind = MUON_ARGS[key]
        try:
            value = _truth(text) if kind is bool else kind(text)
        except ValueError:
            raise ConfigError(f"--optim_args {key}={text}: not a {kind.__name__}") from None
        if key == "adjust_lr_fn" and value not in ADJUST_LR_FNS:
            raise ConfigError(f"--optim_args adjust_lr_fn={text}: torch.optim.Muon takes {' or '.join(ADJUST_LR_FNS)}")
        parsed[key] = value
    return parsed


def _truth(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(text)


def _optim_name(training_args: Any) -> str:
    return str(getattr(getattr(training_args, "optim", None), "value", getattr(training_args, "optim", "")))


def optimizer_problem(training_args: Any) -> str | None:
    """Why the run's --optim cannot run with these settings and packages (a line naming what to do), or None."""
    name = _optim_name(training_args)
    needs = OPTIMIZERS.get(name)
    if needs is None:  # a name transformers added after this table: its own handler says what it needs
        return None
    flag = f"--optim {name}"
    if needs.never:
        return f"{flag} cannot run: {needs.never}"
    if needs.cuda and trains_on_cpu(training_args):
        return f"{flag} needs a CUDA GPU and this run trains on the CPU: {needs.cuda}"
    # what cannot work whatever is installed comes before the package: installing it would not help
    combination = _combination_problem(flag, needs, training_args)
    if combination:
        return combination
    if needs.package and importlib.util.find_spec(needs.package) is None:
        pip = needs.pip or needs.package
        hint = pip if " " in pip else f"pip install {pip}"
        also = f" (or {EXTRA})" if needs.package in OPTIONAL_PACKAGES else ""
        return f"{flag} needs the package {needs.package}, which is not installed: {hint}{also}, or pick another --optim"
    if needs.min_version and Version(importlib.metadata.version(_distribution(needs))) < Version(needs.min_version):
        return (f"{flag} needs {needs.package}>={needs.min_version} (installed: "
                f"{importlib.metadata.version(_distribution(needs))}): pip install -U {needs.pip or needs.package}")
    return None


def _combination_problem(flag: str, needs: Needs, training_args: Any) -> str | None:
    if needs.low_rank and not getattr(training_args, "optim_target_modules", None):
        return (f"{flag} projects the gradients of the linear weights --optim_target_modules names: add "
                "--optim_target_modules all-linear (or a list such as q_proj,v_proj, or a regex)")
    deepspeed = getattr(training_args, "deepspeed", None)
    if (needs.low_rank or needs.per_weight) and deepspeed:
        why = ("updates each weight inside the backward pass, which DeepSpeed's engine runs itself" if needs.per_weight
               else "projects each weight matrix, and DeepSpeed hands the optimizer flat 1-D partitions instead")
        return f"{flag} cannot be used with --deepspeed: it {why}; drop --deepspeed or pick another --optim"
    if (needs.low_rank or needs.per_weight) and fsdp_requested(training_args):
        why = ("updates each weight inside the backward pass, before FSDP has reduced its gradient" if needs.per_weight
               else "projects each weight matrix, and under FSDP each rank holds a shard of it")
        return f"{flag} cannot be used with FSDP: it {why}; train without FSDP or pick another --optim"
    if needs.per_weight:
        accumulation = getattr(training_args, "gradient_accumulation_steps", 1)
        if accumulation > 1:
            return (f"{flag} steps each weight as soon as its gradient is ready, so it cannot accumulate "
                    f"--gradient_accumulation_steps {accumulation} batches: set it to 1 (a larger "
                    "--per_device_train_batch_size instead)")
        if getattr(training_args, "world_size", 1) > 1:
            return (f"{flag} steps each weight on its own rank before the gradients are averaged across ranks "
                    "(transformers: no DDP): train on one process or pick another --optim")
    if flag.endswith("lomo") and getattr(training_args, "fp16", False):
        return (f"{flag} with --fp16: accelerate's fp16 loss scaler runs a plain backward, which passes LOMO's "
                "learning rate on to torch and fails; use --bf16 or float32")
    return None


def check_optimizer(training_args: Any, own_loop: bool = False) -> None:
    """Raise ConfigError (one line) when the run's --optim cannot run (optimizer_problem). `own_loop`: the stage
    builds its optimizer from parameter groups, without the model transformers needs for the optimizers that look at
    the weights themselves (PPO, GRPO and RLOO: rl/trainer.py)."""
    needs = OPTIMIZERS.get(_optim_name(training_args))
    if own_loop and needs is not None and (needs.low_rank or needs.per_weight):
        raise ConfigError(f"--optim {_optim_name(training_args)} cannot be used in PPO, GRPO or RLOO: their loop builds "
                          "the optimizer from parameter groups, and this one needs the model itself (its weight "
                          "matrices, or a step inside the backward pass); pick another --optim, e.g. adamw_8bit")
    if _optim_name(training_args) == MUON:
        muon_args(getattr(training_args, "optim_args", None))
    problem = optimizer_problem(training_args)
    if problem:
        raise ConfigError(problem)


def _distribution(needs: Needs) -> str:
    return (needs.pip or needs.package or "").split(" ")[0]


# The pure-Python packages setup.cfg's `optimizers` extra installs.
OPTIONAL_PACKAGES = ("galore_torch", "apollo_torch", "lomo_optim", "schedulefree", "grokadamw", "optimi")
