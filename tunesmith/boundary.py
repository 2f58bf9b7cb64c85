"""The one error boundary every entry point runs through (stage scripts, console scripts and the
`tunesmith` command). A user error (errors.UserError: data, config, path, template) prints one line
naming the problem and what to do, and exits with status 2; `--debug` or TUNESMITH_DEBUG=1 adds the
traceback. Anything else is a bug and keeps its traceback. A CPU run first hears whether torch's threads
outnumber the cores it can use (utils/threads.py)."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .errors import UserError
from .utils.events import emit
from .utils.logging import setup_logging

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("TUNESMITH_DEBUG", "") not in ("", "0", "false")


def entry_point(run: Callable[[list[str]], Any]) -> Callable[[Sequence[str] | None], None]:
    """main() for a recipe's run(argv): logging set up, user errors as one line and exit status 2."""

    @functools.wraps(run)
    def main(argv: Sequence[str] | None = None) -> None:
        args = list(sys.argv[1:] if argv is None else argv)
        setup_logging()
        try:
            run(args)
        except UserError as e:
            close_progress_bars()
            if debug_requested(args):
                traceback.print_exc()
            _say_error(f"tunesmith: {e.kind}: {e}")
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            _say_error("tunesmith: interrupted")
            sys.exit(EXIT_INTERRUPTED)
        finally:
            leave_process_group()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            exit_without_teardown()

    return main


def _say_error(line: str) -> None:
    """The one line, on stderr and as the `error` event (utils/events.py) of a program that follows the run."""
    print(line, file=sys.stderr, flush=True)
    emit("error", text=line)


def close_progress_bars() -> None:
    """Close the progress bars a stopped run left open, so that the error line starts a line of its own: a bar's
    frame is redrawn in place (it ends in a carriage return, not a newline), and the line printed after it
    otherwise continues the bar's last frame."""
    tqdm = sys.modules.get("tqdm")  # a run that never showed a bar has none to close
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def leave_process_group() -> None:
    """Destroy a distributed run's process group before the interpreter exits. Left to the interpreter's
    teardown, gloo's threads could be destroyed still running: "terminate called without an active
    exception" and exit status 250 (or a launcher's 1) after a run that had trained and saved."""
    dist = sys.modules.get("torch.distributed")  # a run that never imported torch has no group to leave
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if "deepspeed" in sys.modules:
        release_allreduce_buffer()


def release_allreduce_buffer() -> None:
    """DeepSpeed's CPU allreduce (its shm_comm op) maps a 66 MB shared-memory segment per rank, named
    deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, and never unlinks it: every
    multi-rank CPU run left 132 MB of memory in /dev/shm until the machine restarted (218 files, 15 GB, on
    this project's test machine). Each rank unlinks its own once its process group is gone."""
    env = os.environ
    path = os.path.join("/dev/shm", f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR')}_"
                                    f"{env.get('MASTER_PORT')}_{env.get('RANK')}")
    if os.path.exists(path):
        os.unlink(path)


def exit_without_teardown() -> None:
    """End a launched rank that finished its run (everything saved, its process group left) with status 0,
    skipping the interpreter's teardown. There, C++ objects that DeepSpeed's and torch's modules still hold
    (gloo devices and their threads) are destroyed in no set order, and in about one two-rank run in seven
    in a full test run one was destroyed with its thread still running: "terminate called without an active
    exception", SIGABRT, and a failed launch after a run that had trained and saved."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
