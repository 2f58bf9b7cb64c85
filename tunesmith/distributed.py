"""DeepSpeed's process group on machines and launch modes that the libraries leave out: CPU ranks
(gloo), and a single process started without a launcher."""

from __future__ import annotations

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
    launcher's own variables are left alone."""
    if not training_args.deepspeed or any(key in os.environ for key in LAUNCHER_VARIABLES):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if training_args.use_cpu and not torch.distributed.is_initialized():
        bind_deepspeed_comm()
