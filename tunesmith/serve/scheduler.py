"""The one worker thread that runs the model. Requests queue up; the worker takes the first, waits a
short window (--batch_wait_ms) for others to join, and generates the batch together (up to
--max_batch_size rows), while the asyncio loop that serves HTTP stays free. Requests that arrive
during a batch form the next one."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from ..chat.engine import stop_token_ids
from .generation import Event, Job, generate_batch

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 16, wait_s: float = 0.01) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.wait_s = max_batch_size, wait_s
        self.stop_ids = set(stop_token_ids(model, tokenizer))
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._carried: Job | None = None  # a job that did not fit the last batch goes first in the next
        self._thread = threading.Thread(target=self._run, name="tunesmith-generate", daemon=True)
        self.stats = {"requests": 0, "batches": 0, "largest_batch": 0}

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        """Queue a job; its rows must fit one batch (the protocol caps n at max_batch_size)."""
        self.stats["requests"] += 1
        self._queue.put(job)

    def _next_batch(self) -> list[Job] | None:
        first = self._carried or self._queue.get()
        self._carried = None
        if first is None:
            return None
        jobs, rows = [first], first.n
        deadline = time.monotonic() + self.wait_s
        while rows < self.max_batch_size:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # close() once this batch is done
                break
            if rows + job.n > self.max_batch_size:
                self._carried = job
                break
            jobs.append(job)
            rows += job.n
        return jobs

    def _run(self) -> None:
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            jobs = [job for job in jobs if not job.cancelled]
            if not jobs:
                continue
            rows = sum(job.n for job in jobs)
            self.stats["batches"] += 1
            self.stats["largest_batch"] = max(self.stats["largest_batch"], rows)
            try:
                generate_batch(self.model, self.tokenizer, jobs, self.stop_ids)
            except Exception as e:  # a failed batch fails its requests, not the server
                logger.exception("generation failed for a batch of %d rows", rows)
                for job in jobs:
                    job.emit(Event(error=f"generation failed: {type(e).__name__}: {e}"))
