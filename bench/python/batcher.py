"""Dynamic batching for the Python arms py-batch and py-mp-batch.

gRPC worker threads wrap each validated request in a Work and submit it to
a DynamicBatcher; one batching thread forms batches and hands each to the
arm's run function, which finishes every Work with its slice of the scores
(or an error); the worker thread, parked in Work.wait, then answers.
"""

import collections
import logging
import threading
import time

log = logging.getLogger("bench-py")


class Stopped(Exception):
    """The server is stopping: the request was not served."""


class Work:
    """One validated request on its way through a batch."""

    __slots__ = ("dense", "sparse", "n", "arrived", "scores", "error", "_done")

    def __init__(self, dense, sparse):
        self.dense = dense
        self.sparse = sparse
        self.n = dense.shape[0]
        self.arrived = 0.0
        self.scores = None
        self.error = None
        # Held until finish releases it: the cheapest one-shot wake-up in
        # CPython (an Event is a Condition around such a lock).
        self._done = threading.Lock()
        self._done.acquire()

    def finish(self, scores=None, error=None):
        """Hands the waiting thread its scores or error; called once."""
        self.scores = scores
        self.error = error
        self._done.release()

    def wait(self):
        """Blocks until finished; returns the scores or raises the error."""
        self._done.acquire()
        if self.error is not None:
            raise self.error
        return self.scores


class DynamicBatcher:
    """Queues Work for one batching thread, which calls run(batch, examples)
    for each batch it forms. A batch closes once it holds max_examples, or
    window seconds after its oldest request arrived, whichever comes first; a
    request that would overflow it waits for the next one. While run is busy
    requests queue up, so under load batches grow without waiting. When run
    raises, every Work of the batch is finished with the error."""

    def __init__(self, run, window, max_examples, name="batcher"):
        self.run = run
        self.window = window
        self.max_examples = max_examples
        self.queue = collections.deque()
        self.queued = 0  # examples in queue
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self.loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, work):
        with self.cond:
            if self.closed:
                raise Stopped("server is stopping")
            work.arrived = time.monotonic()
            self.queue.append(work)
            self.queued += work.n
            # The batching thread sleeps until a first request arrives or
            # its window ends; only a first request or a full batch changes
            # that, so other submissions need not wake it.
            if len(self.queue) == 1 or self.queued >= self.max_examples:
                self.cond.notify()

    def close(self):
        """Stops the batching thread; queued requests fail with Stopped."""
        with self.cond:
            self.closed = True
            self.cond.notify()

    def take(self):
        """Waits for the next batch; None once closed."""
        with self.cond:
            while not self.queue and not self.closed:
                self.cond.wait()
            if not self.closed:
                deadline = self.queue[0].arrived + self.window
                while self.queued < self.max_examples and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            if self.closed:
                leftover = list(self.queue)
                self.queue.clear()
                for work in leftover:
                    work.finish(error=Stopped("server is stopping"))
                return None
            batch, examples = [], 0
            while self.queue and (not batch or examples + self.queue[0].n <= self.max_examples):
                work = self.queue.popleft()
                batch.append(work)
                examples += work.n
            self.queued -= examples
            return batch, examples

    def loop(self):
        while (got := self.take()) is not None:
            batch, examples = got
            try:
                self.run(batch, examples)
            except Stopped as e:
                for work in batch:
                    work.finish(error=e)
            except Exception as e:
                log.exception("batch of %d requests (%d examples) failed", len(batch), examples)
                for work in batch:
                    work.finish(error=e)
