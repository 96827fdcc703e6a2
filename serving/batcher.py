"""Micro-batching: concurrent requests gathered into one model call on a single worker thread.

One asyncio task collects waiting requests into a batch (up to `max_batch` texts, or until `max_wait_s` has
passed since the first one arrived), hands it to a one-thread executor that tokenises it (padded to the longest
text in the batch) and runs ONNX Runtime, and gives every request its rows back. While a batch runs, new
requests queue up, so under load the next batch is taken at once without waiting. The queue is bounded:
`submit` raises `QueueFull` instead of letting latency grow without limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from serving.validation import Text


class QueueFull(Exception):
    """More requests are waiting than the queue allows."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new requests."""


@dataclass
class _Pending:
    texts: list[Text]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """What one model call did: texts, requests, seconds in the model, seconds the oldest request waited."""

    texts: int
    requests: int
    seconds: float
    waited: float


class MicroBatcher:
    """Gather texts from concurrent callers into batched calls of `infer` (texts -> one row per text).

    Args:
        infer: the model call, run on the worker thread; gets at most `max_batch` texts.
        max_batch: most texts per call. A single request with more texts is run alone, in chunks.
        max_wait_s: how long to wait for more requests after the first one of a batch arrived.
        max_queue: most requests waiting (not counting the batch being computed).
        on_batch: called on the event loop after every model call (metrics).
    """

    def __init__(
        self,
        infer: Callable[[list[Text]], np.ndarray],
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        max_queue: int = 256,
        on_batch: Callable[[BatchStats], None] | None = None,
    ) -> None:
        self.infer = infer
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._waiting: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort-worker")
        self._closing = False
        self._task = asyncio.create_task(self._collect(), name="micro-batcher")

    async def stop(self) -> None:
        """Take no new requests, finish every queued one, then stop the worker."""
        self._closing = True
        if self._task is not None:
            self._wakeup.set()
            await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def submit(self, texts: list[Text]) -> np.ndarray:
        """Queue `texts` and wait for their rows.

        Raises:
            QueueFull: `max_queue` requests are already waiting.
            ShuttingDown: the batcher is stopping (or never started).
        """
        if not self.running:
            raise ShuttingDown("the server is shutting down")
        if len(self._waiting) >= self.max_queue:
            raise QueueFull(f"the request queue is full ({self.max_queue} requests waiting); retry later")
        pending = _Pending(texts, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        self._wakeup.set()
        return await pending.future

    async def _wait_for_more(self, timeout: float) -> bool:
        """Sleep until a request arrives or `timeout` passes (a cancelled Event.wait loses nothing)."""
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            # Fill the batch with what is queued, then wait (up to max_wait_s after the first arrival) for more.
            first_at = loop.time()
            batch = [self._waiting.popleft()]
            size = len(batch[0].texts)
            while size < self.max_batch:
                if self._waiting:
                    if size + len(self._waiting[0].texts) > self.max_batch:
                        break  # it starts the next batch
                    batch.append(self._waiting.popleft())
                    size += len(batch[-1].texts)
                    continue
                remaining = first_at + self.max_wait_s - loop.time()
                if self._closing or remaining <= 0 or not await self._wait_for_more(remaining):
                    break
            await self._run(loop, batch)

    def _infer_chunks(self, texts: list[Text]) -> np.ndarray:
        if len(texts) <= self.max_batch:
            return self.infer(texts)
        return np.concatenate(
            [self.infer(texts[i : i + self.max_batch]) for i in range(0, len(texts), self.max_batch)]
        )

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        texts = [t for p in batch for t in p.texts]
        start = time.perf_counter()
        waited = start - batch[0].queued_at
        try:
            rows = await loop.run_in_executor(self._executor, self._infer_chunks, texts)
        except Exception as e:
            if len(batch) > 1:  # one bad request must not fail the others it was batched with: one by one
                for p in batch:
                    await self._run(loop, [p])
                return
            if not batch[0].future.done():
                batch[0].future.set_exception(e)
            return
        seconds = time.perf_counter() - start
        offset = 0
        for p in batch:
            if not p.future.done():  # done: the caller went away (cancelled)
                p.future.set_result(rows[offset : offset + len(p.texts)])
            offset += len(p.texts)
        if self.on_batch is not None:
            self.on_batch(BatchStats(texts=len(texts), requests=len(batch), seconds=seconds, waited=waited))
