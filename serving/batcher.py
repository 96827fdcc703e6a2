"""Micro-batching: concurrent requests gathered into one model call on a single worker thread.

Requests arrive tokenised (the server tokenises on threads of its own), one item per text. One asyncio task
collects waiting requests into a batch (up to `max_batch` items, or until `max_wait_s` has passed since the first
one arrived), hands it to a one-thread executor that pads it to the longest item and runs ONNX Runtime, and gives
every request its rows back. While a batch runs, new requests queue up, so under load the next batch is taken at
once without waiting. The queue is bounded: `submit` raises `QueueFull` instead of letting latency grow without
limit. It counts items too (texts, or question-answering windows): a request whose items would take the queue past
`max_queue_items` is refused unless the queue is empty, so that a few requests of many windows each cannot queue
unbounded work behind the limit on requests.

Requests with the fewest items left go first, and a request with more than `max_batch` items runs one batch at a
time, going back to the queue in between: a one-text request waits for at most the model call under way, not for
every large request queued before it. That call is bounded too: a batch holds at most `max_tokens` padded tokens
(items times the longest item), so long texts run a few at a time and the wait for the call under way stays short.
So that a stream of small requests cannot hold a large one back for ever,
a request that has seen `STARVING_BATCHES` full batches' worth of later requests' items run goes first.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class QueueFull(Exception):
    """More requests are waiting than the queue allows."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new requests."""


# A request that has seen this many full batches' worth of later requests' items run before it goes first.
STARVING_BATCHES = 4


@dataclass
class _Pending:
    """A request in the queue: its items, `done` of them run (their rows in `rows`), and how many items of
    requests that arrived after it (`order`) ran while it waited (`overtaken`)."""

    items: list[Any]
    future: asyncio.Future
    order: int
    queued_at: float = field(default_factory=time.perf_counter)  # when it (re-)entered the queue
    done: int = 0
    rows: list[np.ndarray] = field(default_factory=list)
    overtaken: int = 0

    @property
    def left(self) -> int:
        return len(self.items) - self.done


_Part = tuple[_Pending, int]  # a request and how many of its items (from `done` on) a batch runs


@dataclass
class BatchStats:
    """What one model call did: texts, requests, seconds in the model, seconds the oldest request waited."""

    texts: int
    requests: int
    seconds: float
    waited: float


class MicroBatcher:
    """Gather items (tokenised texts) from concurrent callers into batched calls of `infer` (one row per item).

    Args:
        infer: the model call, run on the worker thread; gets at most `max_batch` items.
        max_batch: most items per call. A request with more items runs `max_batch` at a time.
        max_wait_s: how long to wait for more requests after the first one of a batch arrived.
        max_queue: most requests waiting (not counting the batch being computed).
        max_queue_items: most items of those requests (None: no limit); a request larger than this alone still
            runs when the queue is empty.
        on_batch: called on the event loop after every model call (metrics).
        max_tokens: most padded tokens per call (items times the longest item's `tokens`); at least one item runs.
        tokens: an item's length in tokens (default: every item counts as one).
    """

    def __init__(
        self,
        infer: Callable[[list[Any]], np.ndarray],
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        max_queue: int = 256,
        on_batch: Callable[[BatchStats], None] | None = None,
        max_tokens: int | None = None,
        tokens: Callable[[Any], int] = lambda item: 1,
        max_queue_items: int | None = None,
    ) -> None:
        self.max_queue_items = max_queue_items
        self.infer = infer
        self.max_tokens = max_tokens
        self.tokens = tokens
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._waiting: list[_Pending] = []
        self._order = itertools.count()
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

    def check_capacity(self, coming: int = 0) -> None:
        """Raise if a request would be refused now, `coming` requests being on their way to `submit` (tokenised).

        Raises:
            QueueFull: `max_queue` requests are already waiting (or coming).
            ShuttingDown: the batcher is stopping (or never started).
        """
        if not self.running:
            raise ShuttingDown("the server is shutting down")
        if len(self._waiting) + coming >= self.max_queue:
            raise QueueFull(f"the request queue is full ({self.max_queue} requests waiting); retry later")

    async def submit(self, items: list[Any]) -> np.ndarray:
        """Queue `items` and wait for their rows.

        Raises:
            QueueFull: `max_queue` requests are already waiting, or `items` would take the queue past
                `max_queue_items`.
            ShuttingDown: the batcher is stopping (or never started).
        """
        self.check_capacity()
        waiting = sum(p.left for p in self._waiting)
        if self.max_queue_items is not None and waiting and waiting + len(items) > self.max_queue_items:
            raise QueueFull(
                f"the request queue is full ({waiting} texts or windows waiting, {len(items)} more would pass "
                f"{self.max_queue_items}); retry later"
            )
        pending = _Pending(items, asyncio.get_running_loop().create_future(), next(self._order))
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
            batch = [self._first()]
            size, width = batch[0][1], self._width(*batch[0])
            while size < self.max_batch:
                if self._waiting:
                    fits = [p for p in self._waiting if p.left <= self.max_batch - size and self._fits(p, size, width)]
                    if not fits:
                        break  # the rest start the next batches
                    smallest = min(fits, key=_smallest)
                    self._waiting.remove(smallest)
                    batch.append((smallest, smallest.left))
                    size, width = size + smallest.left, max(width, self._width(smallest, smallest.left))
                    continue
                remaining = first_at + self.max_wait_s - loop.time()
                if self._closing or remaining <= 0 or not await self._wait_for_more(remaining):
                    break
            self._count_overtaking(batch)
            await self._run(loop, batch)

    def _first(self) -> _Part:
        """The request a batch starts with (the one with the fewest items left, unless one is starving) and how many
        of its items the batch runs."""
        oldest = min(self._waiting, key=lambda p: p.order)
        starving = oldest.overtaken >= STARVING_BATCHES * self.max_batch
        first = oldest if starving else min(self._waiting, key=_smallest)
        self._waiting.remove(first)
        n = min(first.left, self.max_batch)
        while n > 1 and not self._within_budget(n, self._width(first, n)):
            n -= 1
        return first, n

    def _width(self, pending: _Pending, n: int) -> int:
        """The longest of the next `n` items of `pending`, in tokens."""
        return max((self.tokens(item) for item in pending.items[pending.done : pending.done + n]), default=0)

    def _within_budget(self, items: int, width: int) -> bool:
        return self.max_tokens is None or items * width <= self.max_tokens

    def _fits(self, pending: _Pending, size: int, width: int) -> bool:
        """Whether all of `pending`'s items join a batch of `size` items padded to `width` within the token budget."""
        return self._within_budget(size + pending.left, max(width, self._width(pending, pending.left)))

    def _count_overtaking(self, batch: list[_Part]) -> None:
        for waiting in self._waiting:
            waiting.overtaken += sum(n for p, n in batch if p.order > waiting.order)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Part]) -> None:
        items = [item for p, n in batch for item in p.items[p.done : p.done + n]]
        start = time.perf_counter()
        waited = start - min(p.queued_at for p, _ in batch)
        try:
            rows = await loop.run_in_executor(self._executor, self.infer, items)
        except Exception as e:
            if len(batch) > 1:  # one bad request must not fail the others it was batched with: one by one
                for part in batch:
                    await self._run(loop, [part])
                return
            if not batch[0][0].future.done():
                batch[0][0].future.set_exception(e)
            return
        seconds = time.perf_counter() - start
        offset = 0
        for p, n in batch:
            p.rows.append(rows[offset : offset + n])
            p.done += n
            offset += n
            if p.future.done():  # the caller went away (cancelled): its other items are not run
                continue
            if p.left:  # the next batch of a large request queues again, behind smaller ones
                p.queued_at = time.perf_counter()
                self._waiting.append(p)
            else:
                p.future.set_result(np.concatenate(p.rows) if len(p.rows) > 1 else p.rows[0])
        if self.on_batch is not None:
            self.on_batch(BatchStats(texts=len(items), requests=len(batch), seconds=seconds, waited=waited))


def _smallest(pending: _Pending) -> tuple[int, int]:
    return pending.left, pending.order
