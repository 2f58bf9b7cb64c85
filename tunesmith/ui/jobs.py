"""The page's runs: one `tunesmith <stage>` process each, started from an argument list (no shell) in a
process group of its own, its output (stdout and stderr) written to a log file that the page shows, and its
events (utils/events.py: progress, check lines, the one-line error) to a JSON-lines file beside it that the page
reads its state from, never from the printed text.
Stop sends SIGINT, as Ctrl-C would: the run stops between steps, keeps the checkpoints it saved, and
the same command started again resumes from the last one. A run that ignores it is sent SIGTERM, then
SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence

from ..utils.events import EVENTS_FILE_ENV, read_events
from .command_lines import shown

STOP_GRACE_S = 30.0  # how long a stopped run may take to leave before SIGTERM (and as long again before SIGKILL)
EVENTS_TAIL_BYTES = 1 << 20  # the newest events read (progress comes at most once a second)


def _interruptible() -> None:
    """In the child, before exec: SIGINT back to its default. A UI started in the background (`nohup ... &`)
    ignores SIGINT and its children inherit that, so Stop's SIGINT would be lost and the run killed by
    SIGTERM after the grace instead of leaving as an interrupted run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Job:
    """One run of one command: started, followed through its log, stopped."""

    def __init__(self, argv: Sequence[str], log_path: str, cwd: str | None = None, env: dict | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.started = time.time()
        self.ended: float | None = None
        self.stopped = False
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        # Appended: a run started again in the same folder (a resume) keeps the log of its first part; this
        # job's own part starts at `offset`.
        self.offset = os.path.getsize(log_path) if os.path.isfile(log_path) else 0
        self.events_path = os.path.splitext(log_path)[0] + ".events.jsonl"
        open(self.events_path, "w").close()  # this job's own events only
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"$ {shown(self.argv)}\n")
            log.flush()
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=cwd, env={**os.environ, **(env or {}), EVENTS_FILE_ENV: self.events_path},
                                            start_new_session=True, preexec_fn=_interruptible)

    @property
    def running(self) -> bool:
        if self.process.poll() is None:
            return True
        if self.ended is None:
            self.ended = time.time()
        return False

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def status(self) -> str:
        """running, finished, stopped or failed (exit status N)."""
        if self.running:
            return "running"
        if self.stopped:
            return "stopped"
        return "finished" if self.returncode == 0 else f"failed (exit status {self.returncode})"

    def stop(self, grace: float = STOP_GRACE_S) -> str:
        """SIGINT to the run's process group, then SIGTERM and SIGKILL for one that does not leave in time."""
        if not self.running:
            return self.status()
        self.stopped = True
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.running  # noqa: B018 (records when it ended)
        return self.status()

    def wait(self, timeout: float | None = None) -> int:
        code = self.process.wait(timeout=timeout)
        self.running  # noqa: B018
        return code

    def log(self, max_chars: int = 20000) -> str:
        """The end of this job's part of the log."""
        return tail(self.log_path, max_chars, self.offset)

    def events(self, event: str | None = None) -> list[dict]:
        """The newest of the events the run has sent (of one kind, where `event` is given), oldest first."""
        return read_events(self.events_path, event, EVENTS_TAIL_BYTES)

    def error(self) -> str | None:
        """The CLI's one-line error (`tunesmith: config error: ...`) when the run ended with one."""
        if self.running or self.returncode == 0:
            return None
        errors = self.events("error")
        return errors[-1]["text"] if errors else None

    def elapsed(self) -> float:
        return (self.ended or time.time()) - self.started


def tail(path: str, max_chars: int = 20000, start: int = 0) -> str:
    """The end of a text file from byte `start` on (the whole of a short one); '' for a missing one."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - max_chars))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    # tqdm redraws its bar with carriage returns: keep each line's last state
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))
