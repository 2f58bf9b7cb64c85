"""A command's events as JSON lines, for the program that runs it (the web UI) to read instead of the text it prints:
where the environment names a file (TUNESMITH_EVENTS_FILE), each event is appended to it as one JSON object with its
kind and its time; elsewhere nothing is written. The kinds:

- `progress`: a training run's `step` of `max_steps` (at the start, then at most once a second, and at the last step);
- `check`: a line of a command's report of what it wrote and how it was checked (export, merge), as printed;
- `error`: the one line the error boundary prints for a user error or an interrupted run."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

EVENTS_FILE_ENV = "TUNESMITH_EVENTS_FILE"


def emit(event: str, **fields: Any) -> None:
    """Append one event to the events file, where there is one."""
    path = os.environ.get(EVENTS_FILE_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **fields}, ensure_ascii=False, default=str) + "\n")


def report(line: str) -> None:
    """Print a line of a command's report and record it as a `check` event."""
    print(line, flush=True)
    emit("check", text=line)


def read_events(path: str, event: str | None = None, max_bytes: int | None = None) -> list[dict]:
    """The events in a file (of one kind, where `event` is given), oldest first; with max_bytes, only those in its
    last max_bytes. A line being written as it is read is skipped; a missing file has none."""
    try:
        with open(path, "rb") as f:
            if max_bytes is not None:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - max_bytes))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # half written, or the tail's cut first line
            continue
        if isinstance(record, dict) and (event is None or record.get("event") == event):
            events.append(record)
    return events


def report_warning(logger: logging.Logger, message: str, *args: Any) -> None:
    """logger.warning(message, *args), recorded as a `check` event too: a check that could not run is part of the
    report."""
    logger.warning(message, *args)
    emit("check", text=f"warning: {message % args if args else message}")
