"""The shared-memory link between the frontends and the device owner of the
py-mp and py-mp-batch arms.

Memory: per frontend, one /dev/shm file of K slots. A slot carries one
request (py-mp) or one batch (py-mp-batch) to the device owner and its
scores back; cap = next_pow2(--max-batch) rows, each region page-aligned:

    dense   cap x 13 float32         written by the frontend
    pooled  cap x 26 x 128 float32   written by the frontend (its gather's output)
    scores  cap float32              written by the device owner

so the frontend gathers straight into shared memory and the owner can run a
lone slot's bucket (rows past n hold earlier, finite values) without a copy.
tmpfs allocates a page when it is first written, so a slot costs only as
much memory as the largest batch it has carried.

Wake-ups go through the kernel, which also orders the memory accesses on
both sides of each hand-over:

  submit    one pipe for all frontends. A frontend that has filled a slot
            writes a 16-byte record (frontend, slot, examples); writes under
            PIPE_BUF are atomic, so records from concurrent writers never
            interleave. The owner sleeps in poll() on the read end and, once
            woken, drains every record waiting. EOF (every frontend gone)
            tells it to exit.
  complete  one eventfd per slot. The owner writes the scores, then DONE or
            FAILED to the slot's eventfd; the one thread waiting for that
            slot wakes from its blocking read.

Nothing spins: an idle arm sleeps in poll() and read().

The parent creates the link before starting any child and hands each child
its descriptors (pass_fds): the owner gets the pipe's read end and every
frontend's file and eventfds, frontend i the write end and its own. Files
are named /dev/shm/recmesh-bench-py-<parent pid>-<frontend>, so
/proc/PID/maps shows whose they are, and unlinked at once, so nothing is
left in /dev/shm however the arm ends.

Only the standard library is imported at the top: the parent creates the
link without loading NumPy.
"""

import math
import mmap
import os
import select
import struct
import threading

from batcher import Stopped
from layout import EMBEDDING_DIM, NUM_DENSE, NUM_TABLES

RECORD = struct.Struct("<IIII")  # frontend, slot, examples, padding
DONE, FAILED = 1, 2  # what the owner adds to a slot's eventfd
NAME_PREFIX = "recmesh-bench-py-"


def _regions(cap):
    """[(name, shape, offset in the slot)] and the slot's size in bytes."""
    regions, offset = [], 0
    for name, shape in (("dense", (cap, NUM_DENSE)), ("pooled", (cap, NUM_TABLES, EMBEDDING_DIM)),
                        ("scores", (cap,))):
        regions.append((name, shape, offset))
        offset += -(-4 * math.prod(shape) // mmap.PAGESIZE) * mmap.PAGESIZE
    return regions, offset


class Slots:
    """One frontend's slots mapped: dense[slot], pooled[slot] and
    scores[slot] are NumPy float32 views of shared memory."""

    def __init__(self, fd, count, cap):
        import numpy as np

        regions, slot_bytes = _regions(cap)
        self.map = mmap.mmap(fd, count * slot_bytes)
        os.close(fd)  # the mapping keeps the file
        for name, shape, offset in regions:
            # Row-major within a slot, slot_bytes from one slot to the next.
            strides = tuple(4 * math.prod(shape[i + 1:]) for i in range(len(shape)))
            setattr(self, name, np.ndarray((count,) + shape, np.float32, buffer=self.map, offset=offset,
                                           strides=(slot_bytes,) + strides))


class Link:
    """The parent's side: creates the pipe, the files and the eventfds for
    frontends x slots slots of cap rows, and says what each child gets."""

    def __init__(self, frontends, slots, cap):
        self.cap = cap
        self.submit_r, self.submit_w = os.pipe()
        self.mems, self.events = [], []
        size = slots * _regions(cap)[1]
        for i in range(frontends):
            path = f"/dev/shm/{NAME_PREFIX}{os.getpid()}-{i}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.unlink(path)
            self.mems.append(fd)
            self.events.append([os.eventfd(0, os.EFD_CLOEXEC) for _ in range(slots)])

    def owner(self):
        """The device owner's spec (for --link) and descriptors (for
        pass_fds): the pipe's read end, every frontend's file and eventfds."""
        spec = {"cap": self.cap, "submit": self.submit_r,
                "frontends": [{"mem": m, "events": e} for m, e in zip(self.mems, self.events)]}
        return spec, [self.submit_r] + self.mems + [e for es in self.events for e in es]

    def frontend(self, i):
        """Frontend i's spec and descriptors: the pipe's write end, its
        file and its eventfds."""
        spec = {"cap": self.cap, "submit": self.submit_w, "index": i, "mem": self.mems[i],
                "events": self.events[i]}
        return spec, [self.submit_w, self.mems[i]] + self.events[i]

    def close(self):
        """Closes the parent's descriptors once the children have theirs (the
        owner sees EOF only once every write end is closed)."""
        for fd in [self.submit_r, self.submit_w] + self.mems + [e for es in self.events for e in es]:
            os.close(fd)


class FrontendLink:
    """A frontend's side: its slots, taken and given back by its threads."""

    def __init__(self, spec):
        self.index = spec["index"]
        self.submit_fd = spec["submit"]
        self.events = spec["events"]
        self.slots = Slots(spec["mem"], len(self.events), spec["cap"])
        self.free = list(range(len(self.events)))
        self.available = threading.Semaphore(len(self.events))
        self.closed = False

    def acquire(self):
        """Takes a free slot, waiting for one if need be."""
        self.available.acquire()
        if self.closed:
            self.available.release()
            raise Stopped("server is stopping")
        # The most recently freed slot: its pages are the likeliest cached.
        return self.free.pop()

    def release(self, slot):
        self.free.append(slot)
        self.available.release()

    def submit(self, slot, examples):
        """Hands a filled slot to the device owner."""
        os.write(self.submit_fd, RECORD.pack(self.index, slot, examples, 0))

    def wait(self, slot):
        """Blocks until the owner has written the slot's scores."""
        status = os.eventfd_read(self.events[slot])
        if self.closed:
            raise Stopped("server is stopping")
        if status != DONE:
            raise RuntimeError("the device owner failed on this batch (see its log)")

    def close(self):
        """Wakes every waiting thread with Stopped."""
        self.closed = True
        for fd in self.events:
            os.eventfd_write(fd, FAILED)
            self.available.release()


class OwnerLink:
    """The device owner's side: every frontend's slots and the pipe."""

    def __init__(self, spec):
        self.submit_fd = spec["submit"]
        os.set_blocking(self.submit_fd, False)
        self.poller = select.poll()
        self.poller.register(self.submit_fd, select.POLLIN)
        self.frontends = [Slots(f["mem"], len(f["events"]), spec["cap"]) for f in spec["frontends"]]
        self.events = [f["events"] for f in spec["frontends"]]

    def receive(self, block):
        """The submissions waiting, as [(frontend, slot, examples)]: [] if
        none, or, when block, once there is one; None once every frontend
        has closed its end."""
        if block:
            self.poller.poll()
        try:
            data = os.read(self.submit_fd, RECORD.size * 4096)
        except BlockingIOError:
            return []
        if not data:
            return None
        return [(f, s, n) for f, s, n, _ in RECORD.iter_unpack(data)]

    def complete(self, frontend, slot, ok):
        os.eventfd_write(self.events[frontend][slot], DONE if ok else FAILED)
