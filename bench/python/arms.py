"""The arms' serving paths, below the gRPC service of server.py.

Each arm is a model with infer(dense, sparse) -> scores, called by gRPC
worker threads with validated inputs, and close(), which fails whatever
still waits with batcher.Stopped:

  Direct      py (and each py-mp-local process)
  Batched     py-batch
  ShmDirect   a py-mp frontend
  ShmBatched  a py-mp-batch frontend

DeviceOwner is the other end of ShmDirect and ShmBatched. JAX is imported
only by load_network, so a frontend never loads it.
"""

import collections
import json
import logging
import os
import queue
import threading
import time

import numpy as np

from batcher import DynamicBatcher, Work
from dlrm import BucketBuffers, Embeddings, is_table, read_bundle
from layout import NUM_DENSE, next_pow2
from shm import FrontendLink

log = logging.getLogger("bench-py")


def load_network(args, config, tensors):
    """Starts JAX with the arm's XLA threads and returns the dense network,
    every warm-up bucket compiled."""
    if args.xla_threads == "1":
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    # The host CPU unless RECMESH_BENCH_JAX_PLATFORM names another (the GPU
    # pack's run.sh sets "cuda"): the arm then runs JAX's own backend there.
    platform = os.environ.get("RECMESH_BENCH_JAX_PLATFORM", "cpu")
    os.environ["JAX_PLATFORMS"] = platform
    import jax

    from dlrm import DenseNetwork

    jax.config.update("jax_platforms", platform)
    log.info("jax %s on %s", jax.__version__, jax.devices()[0].device_kind)
    # XLA's intra-op threads pick the auto plan (dlrm.HALF_PLAN).
    threads = 1 if args.xla_threads == "1" else len(os.sched_getaffinity(0))
    network = DenseNetwork(config, tensors, args.dense_compute, threads)
    log.info("dense network: %s (--dense-compute %s)", network.description, args.dense_compute)
    network.warm_up(min(args.warm_max, next_pow2(args.max_batch)), log)
    return network


def load(args):
    """Loads what a gRPC-serving process serves with: (model, embeddings).
    A frontend is ready once a request has made the round trip through the
    device owner, which answers only after its warm-up."""
    t0 = time.monotonic()
    if args.role == "frontend":
        config, tensors = read_bundle(args.bundle, want=is_table)
        embeddings = Embeddings(config, tensors)
        log.info("tables read in %.1f s (%s, %.0f MiB)", time.monotonic() - t0, embeddings.dtype,
                 embeddings.table_bytes / (1 << 20))
        link = FrontendLink(json.loads(args.link))
        model = ShmBatched(embeddings, link, args) if args.mode == "py-mp-batch" else ShmDirect(embeddings, link)
        model.infer(np.zeros((1, NUM_DENSE), np.float32), np.zeros((1, embeddings.width), np.int32))
        return model, embeddings
    config, tensors = read_bundle(args.bundle)
    embeddings = Embeddings(config, tensors)
    log.info("bundle read in %.1f s (tables %s, %.0f MiB)", time.monotonic() - t0, embeddings.dtype,
             embeddings.table_bytes / (1 << 20))
    network = load_network(args, config, tensors)
    model = Batched(embeddings, network, args) if args.mode == "py-batch" else Direct(embeddings, network)
    return model, embeddings


def fill(embeddings, batch, examples, dense, pooled):
    """Copies a batch's dense rows into dense[:examples] and gathers all its
    ids at once into pooled[:examples]."""
    if len(batch) == 1:
        dense[:examples] = batch[0].dense
        embeddings.gather(batch[0].sparse, pooled)
    else:
        np.concatenate([w.dense for w in batch], out=dense[:examples])
        embeddings.gather(np.concatenate([w.sparse for w in batch]), pooled)


def finish(batch, scores):
    """Hands each request of a batch its slice of scores."""
    offset = 0
    for work in batch:
        work.finish(scores[offset:offset + work.n].copy())
        offset += work.n


class Direct:
    """py: the receiving thread gathers and runs the network, padding into
    its own buffers."""

    def __init__(self, embeddings, network):
        self.embeddings = embeddings
        self.network = network
        self.local = threading.local()

    def infer(self, dense, sparse):
        bufs = getattr(self.local, "bufs", None)
        if bufs is None:
            bufs = self.local.bufs = BucketBuffers()
        b = dense.shape[0]
        dense_buf, pooled = bufs.get(next_pow2(b))
        dense_buf[:b] = dense
        self.embeddings.gather(sparse, pooled)
        return self.network(dense_buf, pooled)[:b]

    def close(self):
        pass


class Batched:
    """py-batch: one gather and one jitted call per batch, in the batching
    thread."""

    def __init__(self, embeddings, network, args):
        self.embeddings = embeddings
        self.network = network
        self.buffers = BucketBuffers()  # the batching thread's
        self.batcher = DynamicBatcher(self.run, args.batch_window / 1000, args.max_batch)

    def infer(self, dense, sparse):
        work = Work(dense, sparse)
        self.batcher.submit(work)
        return work.wait()

    def run(self, batch, examples):
        dense, pooled = self.buffers.get(next_pow2(examples))
        fill(self.embeddings, batch, examples, dense, pooled)
        finish(batch, self.network(dense, pooled))

    def close(self):
        self.batcher.close()


class ShmDirect:
    """py-mp frontend: per request, the receiving thread takes a slot,
    gathers into it, hands it to the device owner and waits for the scores.
    There are as many slots as worker threads, so none waits for a slot."""

    def __init__(self, embeddings, link):
        self.embeddings = embeddings
        self.link = link

    def infer(self, dense, sparse):
        link = self.link
        slot = link.acquire()
        try:
            n = dense.shape[0]
            link.slots.dense[slot, :n] = dense
            self.embeddings.gather(sparse, link.slots.pooled[slot])
            link.submit(slot, n)
            link.wait(slot)
            return link.slots.scores[slot, :n].copy()
        finally:
            link.release(slot)

    def close(self):
        self.link.close()


class ShmBatched:
    """py-mp-batch frontend: the batching thread takes a slot, gathers the
    whole batch into it and hands it to the device owner; a completion
    thread waits for each slot in turn and hands out the scores. With two
    slots (server.py's BATCH_SLOTS) the next batch is gathered while the
    owner runs the last; when both are out, requests queue and the next
    batch grows."""

    def __init__(self, embeddings, link, args):
        self.embeddings = embeddings
        self.link = link
        self.inflight = queue.SimpleQueue()
        self.completer = threading.Thread(target=self.complete, name="completer", daemon=True)
        self.completer.start()
        self.batcher = DynamicBatcher(self.run, args.batch_window / 1000, args.max_batch)

    def infer(self, dense, sparse):
        work = Work(dense, sparse)
        self.batcher.submit(work)
        return work.wait()

    def run(self, batch, examples):
        link = self.link
        slot = link.acquire()
        try:
            fill(self.embeddings, batch, examples, link.slots.dense[slot], link.slots.pooled[slot])
            link.submit(slot, examples)
        except BaseException:
            link.release(slot)
            raise
        self.inflight.put((slot, batch))

    def complete(self):
        while (item := self.inflight.get()) is not None:
            slot, batch = item
            try:
                self.link.wait(slot)
                finish(batch, self.link.slots.scores[slot])
            except Exception as e:
                for work in batch:
                    work.finish(error=e)
            finally:
                self.link.release(slot)

    def close(self):
        self.batcher.close()
        self.link.close()
        self.inflight.put(None)


class DeviceOwner:
    """The device owner of py-mp (merge False: one jitted call per
    submission, in arrival order) and py-mp-batch (merge True: a zero-wait
    merger that takes every submission waiting, up to max_examples, as one
    call; it never waits for more)."""

    def __init__(self, link, network, merge, max_examples):
        self.link = link
        self.network = network
        self.merge = merge
        self.max_examples = max_examples
        self.buffers = BucketBuffers()

    def serve(self):
        """Runs until every frontend has gone."""
        pending = collections.deque()
        while True:
            got = self.link.receive(block=not pending)
            if got is None:
                return
            pending.extend(got)
            if not pending:
                continue
            take = [pending.popleft()]
            examples = take[0][2]
            while self.merge and pending and examples + pending[0][2] <= self.max_examples:
                take.append(pending.popleft())
                examples += take[-1][2]
            self.run(take, examples)

    def run(self, take, examples):
        """Scores the submissions take, [(frontend, slot, n)], of examples
        examples in all: a lone one straight from its slot, several merged
        into one padded bucket."""
        frontends = self.link.frontends
        bucket = next_pow2(examples)
        try:
            if len(take) == 1:
                f, s, _ = take[0]
                scores = self.network(frontends[f].dense[s, :bucket], frontends[f].pooled[s, :bucket])
            else:
                dense, pooled = self.buffers.get(bucket)
                offset = 0
                for f, s, n in take:
                    dense[offset:offset + n] = frontends[f].dense[s, :n]
                    pooled[offset:offset + n] = frontends[f].pooled[s, :n]
                    offset += n
                scores = self.network(dense, pooled)
        except Exception:
            log.exception("device owner: %d examples from %d submissions failed", examples, len(take))
            for f, s, _ in take:
                self.link.complete(f, s, False)
            return
        offset = 0
        for f, s, n in take:
            frontends[f].scores[s, :n] = scores[offset:offset + n]
            self.link.complete(f, s, True)
            offset += n
