"""CPU threads against the cores a run can really use. torch starts one intra-op thread per physical
core of the machine, in every process; on a machine whose cores are shared (other users, other
ranks, a container's CPU quota) the threads then wait on each other and training runs several times
slower with nothing said. The entry-point boundary calls warn_about_cpu_threads() once, on CPU runs."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# The 1-minute load average above this share of the usable cores means other work already holds them.
BUSY_SHARE = 0.5


def thread_advice(threads: int, processes: int, cores: int, load: float | None,
                  threads_chosen: bool) -> str | None:
    """What to change, or None when the numbers are fine. threads: torch's intra-op threads per
    process; processes: this machine's ranks; cores: the cores this process may use; load: the
    1-minute load average (None where unknown); threads_chosen: OMP_NUM_THREADS was set (a busy
    machine is then the user's call, oversubscription still is not)."""
    processes, cores = max(processes, 1), max(cores, 1)
    fits = max(cores // processes, 1)
    if threads * processes > cores:
        return (f"torch runs {threads} threads in each of {processes} process(es) on the {cores} core(s) this run "
                f"may use, so they wait on each other: set OMP_NUM_THREADS={fits} (or torch.set_num_threads({fits}))")
    if not threads_chosen and load is not None and load > BUSY_SHARE * cores:
        idle = max(int(cores - load) // processes, 1)
        if idle < threads:
            return (f"the machine is already busy (1-minute load average {load:.1f} on the {cores} core(s) this run "
                    f"may use), so torch's {threads} threads per process will wait for cores and training may run "
                    f"several times slower: set OMP_NUM_THREADS={idle} (or torch.set_num_threads({idle})), or run "
                    "when the machine is idle")
    return None


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(int(int(quota) / int(period)), 1))
    except (OSError, ValueError):
        pass
    return cores


def warn_about_cpu_threads() -> None:
    """One warning when torch's threads outnumber the cores this run can use (CPU runs only)."""
    import torch

    if torch.cuda.is_available():
        return
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    advice = thread_advice(torch.get_num_threads(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), usable_cores(),
                           load, threads_chosen=bool(os.environ.get("OMP_NUM_THREADS")))
    if advice:
        logger.warning(advice)
