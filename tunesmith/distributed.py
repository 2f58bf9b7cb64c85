"""DeepSpeed's and FSDP2's process groups on machines and launch modes that the libraries leave out: CPU
ranks (gloo), and a single process started without a launcher; and where a run's sharding settings come from:
its DeepSpeed config (--deepspeed, a file or a dict) and its FSDP settings (--fsdp_config, or the environment
`accelerate launch` exports)."""

from __future__ import annotations

import copy
import json
import os
import socket
from typing import Any

import torch

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def bind_deepspeed_comm() -> None:
    """On CPU, accelerate starts torch.distributed (gloo) itself but never initializes
    deepspeed.comm (it does so only on accelerators), so DeepSpeed's config sees a world of one
    process and rejects the batch size the Trainer computed for all ranks ("4 != 2 * 1 * 1").
    Binding deepspeed.comm to the process group accelerate already made fixes that; with no group
    yet, this starts one from the environment."""
    import deepspeed.comm as ds_comm

    if not ds_comm.is_initialized():
        ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def start_single_process_world(training_args: Any) -> None:
    """`python sft/train.py --deepspeed ...` with no torchrun/deepspeed launcher: DeepSpeed still
    needs a process group, and without the launcher's environment it falls back to MPI discovery
    ("No module named 'mpi4py'"). Describe a world of one process, as transformers' docs do for
    DeepSpeed in a notebook, and on CPU start its gloo group. Called by the recipes just before any
    model loads (not when arguments are parsed, which tests and tools do without training); a
    launcher's own variables are left alone. FSDP without a launcher is refused here, in one line,
    rather than by the Trainer once the model has loaded."""
    if any(key in os.environ for key in LAUNCHER_VARIABLES):
        return
    if fsdp_requested(training_args):
        from .errors import ConfigError

        raise ConfigError("FSDP shards the model over several processes: start the run with `accelerate launch "
                          "--config_file configs/fsdp2.yaml` or `torchrun --nproc_per_node N`, or train one process "
                          "without --fsdp_config")
    if not training_args.deepspeed:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if training_args.use_cpu and not torch.distributed.is_initialized():
        bind_deepspeed_comm()


def zero3_inference_engine(model: torch.nn.Module, deepspeed_config: dict) -> Any:
    """A frozen model that only runs forward beside a ZeRO-3 run (PPO's reward model, distillation's teacher): its
    own DeepSpeed engine with the run's config and no optimizer, as TRL's prepare_deepspeed does. Under ZeRO-3
    transformers loads every model inside deepspeed.zero.Init, so its weights are empty placeholders until an
    engine gathers them, layer by layer, during the forward; every rank must then run the same forwards. The
    config's training-only blocks go (DeepSpeed would build an optimizer or a schedule with nothing to step), and
    its bucket sizes still "auto" are filled from this model's hidden size, as transformers fills the trained
    model's. Not TRL's prepare_deepspeed itself: it sets those sizes as dotted top-level keys
    ("zero_optimization.reduce_bucket_size"), which leave the nested "auto" values in place, and distillation builds
    its teacher's engine before transformers has filled them."""
    import deepspeed

    config = copy.deepcopy(deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    zero = config.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden:
        for key, value in (("reduce_bucket_size", hidden * hidden),
                           ("stage3_prefetch_bucket_size", int(0.9 * hidden * hidden)),
                           ("stage3_param_persistence_threshold", 10 * hidden)):
            if zero.get(key) == "auto":
                zero[key] = value
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeedEngine.eval returns None, not the module
    return engine


# ---------------------------------------------------------------------------- FSDP2

FSDP_LAUNCH_VARIABLE = "ACCELERATE_USE_FSDP"  # what `accelerate launch --config_file configs/fsdp2.yaml` sets


def deepspeed_config(training_args: Any) -> dict:
    """The DeepSpeed config a run was given (empty when none); a file path or an inline dict."""
    ds = getattr(training_args, "deepspeed", None)
    if not ds:
        return {}
    if isinstance(ds, dict):
        return ds
    from .errors import ConfigError

    if not os.path.isfile(ds):
        raise ConfigError(f"--deepspeed {ds}: no such file (shipped configs: configs/ds_zero2.json, configs/ds_zero3.json)")
    with open(ds, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--deepspeed {ds}: not valid JSON at line {e.lineno}: {e.msg}") from None


def zero_stage(training_args: Any) -> int:
    """The ZeRO stage of the run's DeepSpeed config; 0 without one."""
    return int(deepspeed_config(training_args).get("zero_optimization", {}).get("stage", 0))


def fsdp_requested(training_args: Any) -> bool:
    """FSDP asked for by --fsdp/--fsdp_config, or by an accelerate launch with an FSDP config."""
    return bool(getattr(training_args, "fsdp", None)) or \
        os.environ.get(FSDP_LAUNCH_VARIABLE, "false").lower() == "true"


def fsdp_setting(training_args: Any, key: str, launch_default: str) -> str:
    """One FSDP setting (transformers' fsdp_config key, e.g. version, state_dict_type) of a run that asked for
    FSDP: from --fsdp_config, else from what accelerate launch exported (FSDP_<KEY>; launch_default is
    accelerate's default when its config left the key out)."""
    config = getattr(training_args, "fsdp_config", None)
    if getattr(training_args, "fsdp", None) and isinstance(config, dict):
        defaults = {"version": "2", "state_dict_type": "FULL_STATE_DICT"}  # transformers' (training_args.py)
        return str(config.get(key, defaults.get(key, launch_default)))
    return os.environ.get(f"FSDP_{key.upper()}", launch_default)


def read_fsdp_config(path: str) -> dict:
    """The FSDP settings of --fsdp_config PATH, in transformers' fsdp_config form: a JSON or YAML file of
    those settings, or an accelerate config file (configs/fsdp2.yaml), whose `fsdp_config` section is read.
    accelerate names parameter offload fsdp_offload_params, transformers cpu_offload."""
    import yaml

    from .errors import ConfigError

    if not os.path.isfile(path):
        raise ConfigError(f"--fsdp_config {path}: no such file (shipped: configs/fsdp2.yaml)")
    with open(path, encoding="utf-8") as f:
        try:
            loaded = yaml.safe_load(f)  # JSON is YAML too
        except yaml.YAMLError as e:
            raise ConfigError(f"--fsdp_config {path}: not valid YAML or JSON ({e})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--fsdp_config {path}: holds a {type(loaded).__name__}, not a mapping of FSDP settings")
    if "distributed_type" in loaded and loaded["distributed_type"] != "FSDP":
        raise ConfigError(f"--fsdp_config {path}: an accelerate config for distributed_type "
                          f"{loaded['distributed_type']}, not FSDP (see configs/fsdp2.yaml)")
    settings = dict(loaded.get("fsdp_config", loaded))
    for key in ("offload_params", "fsdp_offload_params"):
        if key in settings:
            settings["cpu_offload"] = settings.pop(key)
    return settings


def shard_cpu_ranks_with_fsdp(accelerator: Any, plugin_args: dict | None) -> None:
    """accelerate turns FSDP on only for accelerator ranks (its state keeps CPU ranks as MULTI_CPU and drops
    the plugin), though torch's fully_shard runs on CPU ranks with gloo. Make this process group an FSDP one:
    the plugin from the Trainer's arguments (--fsdp_config) or, under `accelerate launch`, from the
    environment. Mixed precision stays autocast's, as on one process (a bf16 MixedPrecisionPolicy would also
    round the float32 weights a CPU keeps, and the losses with them). PartialState is set too, since every
    AcceleratorState() call copies its distributed type back."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
