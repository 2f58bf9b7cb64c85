"""The engine on a worker thread of its own, for the server: while rows are being generated, requests
that arrive join the batch at the next step (up to --max_batch_size rows); when the worker is idle, the first request waits a short window (--batch_wait_ms) for others to share its
prefill. The asyncio loop that serves HTTP never waits on the model. A job whose caller is gone is
cancelled: its rows end at the next step, and one still waiting is dropped with its replies ended
"cancelled", so every job's caller hears the end of each reply. On shutdown every job is cancelled so that
no generation keeps the server up."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from .engine import Batch, Request
from .results import Event

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 16, wait_s: float = 0.01) -> None:
        self.max_batch_size, self.wait_s = max_batch_size, wait_s
        self.batch = Batch(model, tokenizer)
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._held: list[Request] = []  # jobs that did not fit yet go first next time
        self._closing = False
        self._stopping = False  # shutting down: every job, running or not, is cancelled
        self._accepting = threading.Lock()  # no job is queued behind the shutdown's wake-up
        self._thread = threading.Thread(target=self._run, name="tunesmith-generate", daemon=True)
        self._counts = {"requests": 0, "prefills": 0, "largest_batch": 0}

    @property
    def stats(self) -> dict[str, int]:
        """Requests taken, prefills run and the largest batch so far; rows generating and jobs waiting now."""
        return {**self._counts, "running": len(self.batch), "waiting": self._queue.qsize() + len(self._held)}

    def start(self) -> None:
        self._thread.start()

    def cancel_all(self) -> None:
        """Shutting down: every job, running, waiting or submitted from now on, ends "cancelled" at the
        worker's next step (the worker thread sets the flags: it alone walks the batch and the queue)."""
        with self._accepting:
            self._stopping = True
            self._queue.put(None)  # wakes an idle worker; it takes no job after this

    def close(self) -> None:
        self.cancel_all()
        self._thread.join(timeout=10)

    def submit(self, job: Request) -> None:
        """Queue a job; its rows must fit one batch (the protocol caps n at max_batch_size)."""
        self._counts["requests"] += 1
        with self._accepting:
            if self._stopping:
                job.end_unstarted()
            else:
                self._queue.put(job)

    def _get(self, timeout: float | None) -> Request | None:
        """The next queued job (None: none within the timeout, or closing); timeout None blocks, 0 polls."""
        try:
            job = self._queue.get(timeout=timeout) if timeout != 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        self._closing = self._closing or job is None
        return job

    def _fits(self, job: Request, room: int, adapters: set) -> bool:
        """Whether a job joins now: its rows fit, and its adapter may share the batch (any adapter when
        peft can mix them in one forward; else only the adapter already running)."""
        return job.n <= room and (self.batch.mixes_adapters or not adapters or adapters == {job.adapter})

    def _take(self) -> list[Request]:
        """Jobs to admit now, as many as fit the rows left, the ones held back before first. Idle: block for
        the first, then wait the window for more; busy: only those already queued, so running rows never wait.
        A job that does not fit yet is held back, in order, for a later step."""
        room = self.max_batch_size - len(self.batch)
        adapters = {row.request.adapter for row in self.batch.rows}
        jobs: list[Request] = []
        held = []
        for job in self._held:
            if job.cancelled or self._stopping:
                job.end_unstarted()
                continue
            if not held and self._fits(job, room, adapters | {j.adapter for j in jobs}):
                jobs.append(job)
                room -= job.n
            else:
                held.append(job)
        self._held = held
        idle = not len(self.batch)
        deadline = None
        while room > 0 and not self._closing:
            if idle and not jobs and not held:
                timeout = None
            elif idle:
                deadline = deadline or time.monotonic() + self.wait_s
                timeout = max(0.0, deadline - time.monotonic())
            else:
                timeout = 0
            job = self._get(timeout)
            if job is None:
                break
            if job.cancelled or self._stopping:
                job.end_unstarted()
                continue
            if not self._held and self._fits(job, room, adapters | {j.adapter for j in jobs}):
                jobs.append(job)
                room -= job.n
            else:  # behind a held job it waits its turn: first come, first served
                self._held.append(job)
        return jobs

    def _run(self) -> None:
        while not (self._closing and not len(self.batch)):
            jobs = self._take()
            if self._stopping:
                for job in self.batch.requests:
                    job.cancelled = True
            try:
                if jobs:
                    self.batch.admit(jobs)
                    self._counts["prefills"] += 1
                    self._counts["largest_batch"] = max(self._counts["largest_batch"], len(self.batch))
                if len(self.batch):
                    self.batch.step()
            except Exception as e:  # a failed step fails the requests in it, not the server
                logger.exception("generation failed with %d rows", len(self.batch))
                for job in {id(j): j for j in self.batch.requests + jobs}.values():
                    job.emit(Event(error=f"generation failed: {type(e).__name__}: {e}"))
                self.batch.reset()
