"""Part IV: allreduce variants (flat, bucketed, ring), overlap with backward, and the cost model.

Every variant leaves each tensor holding the elementwise sum, in place, like `helpers.allreduce`.
"""
import math
import threading

import torch

from ..costs import ring_bytes_per_device
from ..models import lenet, loss
from ..ring import ring_all_reduce
from ..runtime.traffic import ByteLog
from .simulated import allreduce, sgd, split_batch

__all__ = ["flatten", "unflatten_into", "flat_allreduce", "bucketed_allreduce",
           "ring_allreduce", "OverlapReducer", "train_batch_overlap",
           "allreduce_time", "fit_alpha_beta", "exposed_seconds", "ASSUMED_LINKS",
           "ASSUMED_BACKWARD_S"]


def flatten(tensors):
    """One contiguous 1-D tensor holding all of `tensors` (a copy), in order."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat, tensors):
    """Copy consecutive pieces of `flat` back into `tensors` (in place, shapes kept)."""
    total = sum(t.numel() for t in tensors)
    if total != flat.numel():
        raise ValueError(f"flat has {flat.numel()} numbers but the tensors hold {total}")
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def flat_allreduce(grads):
    """Allreduce k replicas' gradient lists (`grads[c]` = the list on device c) through ONE flat
    buffer per device: 2(k-1) copies in all, instead of 2(k-1) per parameter."""
    bufs = [flatten(g) for g in grads]
    allreduce(bufs)
    for buf, g in zip(bufs, grads, strict=True):
        unflatten_into(buf, g)


def bucketed_allreduce(grads, bucket_bytes=1 << 20):
    """As flat_allreduce, in buckets of about `bucket_bytes`, so a bucket can go as soon as its
    gradients are ready (DDP's default is 25 MB; LeNet's 0.5 MB fits in one)."""
    buckets, cur, size = [], [], 0
    for i, g in enumerate(grads[0]):
        cur.append(i)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    for idx in buckets:
        flat_allreduce([[g[i] for i in idx] for g in grads])
    return buckets


def ring_allreduce(data):
    """Ring allreduce over k tensors of one shape (one per device), in place.

    Each tensor is cut into k chunks (sizes differ by at most one). Reduce-scatter: in k-1 steps,
    device i passes one chunk to device i+1, which adds it to its own; afterwards device i holds
    the full sum of chunk i+1. All-gather: k-1 more steps pass the summed chunks round the ring.
    Returns the number of elements each device sent: 2(k-1)/k of the tensor, whatever k is.
    (Part I's `ring_all_reduce` runs the ring; its ByteLog counts the elements.)
    """
    k = len(data)
    if k == 0:
        raise ValueError("ring_allreduce needs at least one tensor")
    log = ByteLog()
    summed = ring_all_reduce(list(data), [t.device for t in data], log)
    for t, total in zip(data, summed, strict=True):
        t.copy_(total)
    return [int(log.numbers(src=i)) for i in range(k)]


class OverlapReducer:
    """Allreduce gradients DURING backward, bucket by bucket, as DistributedDataParallel does.

    `device_params[c]` are replica c's parameters. A post-accumulate-grad hook on each marks its
    gradient ready; when every replica's gradients of a bucket are ready, the bucket is reduced
    at once, while autograd goes on computing earlier layers. On CUDA only replica 0's GPU, where
    the sum is formed, gets a side stream for the reduction; work on the other GPUs is queued on
    their current streams. So replica 0's GPU overlaps the reduction with its backward; the other
    GPUs do not (DDP gives every rank its own communication stream).
    Buckets are filled in reverse parameter order: the last layer's gradients arrive first.
    Call `wait()` after backward and before the optimizer step.
    """

    def __init__(self, device_params, bucket_bytes=1 << 18):
        self.device_params, self.k = device_params, len(device_params)
        self.buckets, cur, size = [], [], 0
        for i in reversed(range(len(device_params[0]))):
            p = device_params[0][i]
            cur.append(i)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(cur)
                cur, size = [], 0
        if cur:
            self.buckets.append(cur)
        self.bucket_of = {i: b for b, idx in enumerate(self.buckets) for i in idx}
        self.lock, self.reduced = threading.Lock(), []
        self.streams = {}
        for params in device_params:
            for p in params:
                if p.is_cuda and p.device not in self.streams:
                    self.streams[p.device] = torch.cuda.Stream(p.device)
        self.handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                        for params in device_params for i, p in enumerate(params)]
        self._reset()

    def _reset(self):
        self.pending = [len(idx) * self.k for idx in self.buckets]

    def _make_hook(self, i):
        def hook(param):
            b = self.bucket_of[i]
            with self.lock:   # autograd runs one thread per GPU: hooks may race
                self.pending[b] -= 1
                ready = self.pending[b] == 0
            if ready:
                self._reduce(b)
        return hook

    def _reduce(self, b):
        grads = [[params[i].grad for i in self.buckets[b]] for params in self.device_params]
        if not self.streams:
            flat_allreduce(grads)
        else:
            for d, s in self.streams.items():   # the side stream waits for backward's work so far
                s.wait_stream(torch.cuda.current_stream(d))
            with torch.cuda.stream(self.streams[grads[0][0].device]):
                flat_allreduce(grads)
        self.reduced.append(b)

    def wait(self):
        """Block the devices' current streams until every bucket is reduced; reset for next step."""
        if any(self.pending):
            raise RuntimeError(f"buckets {[b for b, n in enumerate(self.pending) if n]} never "
                               "became ready: did every replica run backward?")
        for d, s in self.streams.items():
            torch.cuda.current_stream(d).wait_stream(s)
        self._reset()

    def remove(self):
        for h in self.handles:
            h.remove()


def train_batch_overlap(X, y, device_params, devices, lr, reducer):
    """Part II's train_batch with the allreduce done by `reducer` (an OverlapReducer on
    `device_params`) while backward runs, instead of after it."""
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, W), y_shard).sum()
          for X_shard, y_shard, W in zip(X_shards, y_shards, device_params, strict=True)]
    for l in ls:   # the buckets of the last replica are reduced as its gradients arrive
        l.backward()
    reducer.wait()
    for param in device_params:
        sgd(param, lr, X.shape[0])
    return sum(l.detach().to(devices[0]) for l in ls)


# --- the alpha-beta cost model and measured allreduce times (scaling.ipynb) -------------------

def allreduce_time(n_bytes, k, alpha, beta, algorithm="ring"):
    """Seconds for an allreduce of n_bytes over k devices: a latency `alpha` per message and
    bandwidth `beta` bytes/s per link. Ring: 2(k-1) steps of n/k bytes each. Naive (through one
    device): that device receives then sends (k-1) full copies."""
    if k <= 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (k - 1) * alpha + ring_bytes_per_device(n_bytes, k) / beta
    if algorithm == "naive":
        return 2 * (k - 1) * (alpha + n_bytes / beta)
    raise ValueError(f"unknown algorithm {algorithm!r}: 'ring' or 'naive'")


# The scaling chapter's assumed links (assumed values, not measurements: its "On paper" section
# states them) and its assumed ResNet-18 backward; its cells spell them out, and
# tests/test_notebook_sync.py keeps them equal to these, which other chapters read.
ASSUMED_LINKS = dict(node=dict(alpha=5e-6, beta=300e9),
                     network=dict(alpha=15e-6, beta=50e9))
ASSUMED_BACKWARD_S = 30e-3


def exposed_seconds(n_bytes, bucket_bytes, k, alpha, beta, backward_s):
    """Seconds of all-reduce left after backward ends (buckets sent as
    soon as backward has produced them)."""
    buckets = max(1, math.ceil(n_bytes / bucket_bytes))
    size = n_bytes / buckets
    end = 0.0
    for i in range(buckets):
        ready = backward_s * (i + 1) / buckets
        end = max(ready, end) + allreduce_time(size, k, alpha, beta)
    return max(0.0, end - backward_s)


def fit_alpha_beta(n_bytes, seconds):
    """Least-squares fit of t = alpha + n / beta; returns (alpha seconds, beta bytes/s).

    The residuals are relative (each equation divided by its t), so the small sizes, which
    decide alpha, weigh as much as the large ones, which decide beta.
    """
    t = torch.tensor(seconds, dtype=torch.float64)
    A = torch.stack([torch.ones(len(n_bytes), dtype=torch.float64),
                     torch.tensor(n_bytes, dtype=torch.float64)], dim=1) / t.unsqueeze(1)
    sol = torch.linalg.lstsq(A, torch.ones(len(t), 1, dtype=torch.float64)).solution.squeeze(1)
    alpha, inv_beta = sol.tolist()
    return max(alpha, 0.0), (1 / inv_beta if inv_beta > 0 else float("inf"))
