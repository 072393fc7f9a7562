"""Checks for the exercises of Part I's data-parallel chapter: combining mean-loss gradients,
aggregate-then-broadcast in place (placed on simulated GPUs), the bytes of two all-reduces."""
import math

import torch

from .. import CommLog, ring_all_reduce, send
from ._core import (FakeGPUs, as_pair, check, describe_device, expect, fresh_generator, randint)

__all__ = ["check_combine_mean_grads", "check_reduce_then_broadcast",
           "check_bytes_sent_naive_vs_ring"]

CPU = torch.device("cpu")


def _close(got, want):
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.detach().double().cpu(), want.double(), rtol=1e-5, atol=1e-6))


@check("combine_mean_grads", observes=[
    "the tensor returned for fresh shard gradients and unequal shard sizes, against the full "
    "batch's mean-loss gradient"])
def check_combine_mean_grads(fn):
    """fn(grads, sizes): the full batch's mean-loss gradient from each shard's mean-loss
    gradient."""
    g = fresh_generator()
    for _ in range(3):
        k = randint(g, 2, 5)
        sizes = [randint(g, 1, 9) for _ in range(k)]
        while len(set(sizes)) == 1:
            sizes[0] += 1
        grads = [torch.randn(3, 2, generator=g) for _ in range(k)]
        call = f"combine_mean_grads(…, sizes={sizes})"
        got = fn([gr.clone() for gr in grads], list(sizes))
        want = sum(gr * s for gr, s in zip(grads, sizes)) / sum(sizes)
        expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
               f"{call} returned {type(got).__name__}, expected a tensor of shape "
               f"{tuple(want.shape)}")
        if _close(got, want):
            continue
        expect(not _close(got, sum(grads) / k),
               f"{call}: a plain average of the shard gradients overweights the small shards: "
               "weight each by its size")
        expect(not _close(got, sum(grads)),
               f"{call}: you summed the shard gradients: each is a mean over its shard, so "
               "weight it by the shard's size and divide by the batch size")
        expect(False, f"{call}: the result differs from the full batch's mean gradient")


@check("reduce_then_broadcast", references=["allreduce", "ring_allreduce", "flat_allreduce",
                                           "bucketed_allreduce", "sum_into_all"], observes=[
    "on CPU tensors: afterwards every tensor of the list (the same objects, the same storage) "
    "holds the sum",
    "on k simulated GPUs (tensor i on cuda:i): no operation mixed devices, and every device's "
    "tensor ends up computed from every device's gradient (the sum travelled to each)"])
def check_reduce_then_broadcast(fn):
    """fn(grads): steps 3 and 4, in place: afterwards every tensor in `grads` holds their sum."""
    g = fresh_generator()
    for _ in range(3):
        k = randint(g, 2, 5)
        grads = [torch.randn(4, 3, generator=g) for _ in range(k)]
        originals, own = list(grads), [gr.clone() for gr in grads]
        call = f"reduce_then_broadcast on {k} devices"
        fn(grads)
        want = sum(own)
        for i, orig in enumerate(originals):
            if grads[i] is not orig and torch.allclose(grads[i], want, atol=1e-5):
                expect(torch.allclose(orig, want, atol=1e-5),
                       f"{call}: tensor {i} of the list was replaced by a new tensor; the "
                       "device's own gradient still holds its local value: write into it in "
                       "place (copy_)")
            expect(torch.allclose(orig, want, atol=1e-5),
                   f"{call}: tensor {i} does not hold the sum of the {k} gradients" + (
                       " (it still holds its own gradient)" if torch.allclose(orig, own[i])
                       else ""))
        gpus = FakeGPUs(k)
        fakes = [gpus.tensor(gr, i) for i, gr in enumerate(own)]
        keys = [(f.untyped_storage()._cdata, 0) for f in fakes]
        _, rec = gpus.run(fn, list(fakes), what=call)
        for i, f in enumerate(fakes):
            read = {(r.key, r.version) for op in rec.ancestors(f) for r in op.reads}
            missing = [j for j, key in enumerate(keys) if j != i and key not in read]
            expect(not missing, f"{call}: the gradient on {describe_device(gpus.devices[i])} "
                                f"never received the sum: the gradients of device "
                                f"{', '.join(map(str, missing))} did not reach it (add them up on "
                                "device 0, then copy the sum into every device's tensor)")


def _naive_allreduce(xs, devices, log):
    """Reduce to device 0, then broadcast from it (steps 3 and 4 of data_parallel), logged."""
    total = sum(send(x, i, 0, devices, log, "reduce") for i, x in enumerate(xs))
    return [send(total, 0, i, devices, log, "broadcast") for i in range(len(xs))]


@check("bytes_sent_naive_vs_ring", references=["ring_bytes_per_device",
                                              "ring_all_reduce", "ring_allreduce"], observes=[
    "the pair returned against the bytes device 0 sends in a reduce-then-broadcast run and each "
    "device sends in a ring all-reduce run, counted by the check; the course's ring and its "
    "byte formulas are unavailable to the answer"])
def check_bytes_sent_naive_vs_ring(fn):
    """fn(nbytes, k) -> (bytes device 0 sends when it reduces and broadcasts, bytes each device
    sends in a ring all-reduce), for a gradient of nbytes on k devices; counted from real runs."""
    g = fresh_generator()
    seen = set()
    for _ in range(5):
        k = randint(g, 2, 8)
        n = k * randint(g, 1, 200)               # elements: a multiple of k, equal chunks
        nbytes = 4 * n
        xs = [torch.randn(n, generator=g) for _ in range(k)]
        log_naive, log_ring = CommLog(), CommLog()
        _naive_allreduce(xs, [CPU] * k, log_naive)
        ring_all_reduce(xs, [CPU] * k, log_ring)
        naive, ring = log_naive.sent_by(0), log_ring.sent_by(0)
        call = f"bytes_sent({nbytes}, {k})"
        got_naive, got_ring = as_pair(fn(nbytes, k), call, "naive device 0, ring per device")
        seen.add((got_naive, got_ring))
        if got_naive != naive:
            expect(got_naive != 2 * naive, f"{call}: device 0 sends {naive} bytes, you "
                   f"returned {got_naive:g}, its sends AND receives: count only what it sends")
            expect(got_naive != nbytes * k, f"{call}: device 0 sends {naive} bytes: the sum "
                   f"goes to the {k - 1} OTHER devices, not to itself")
            expect(False, f"{call}: device 0 sends {naive} bytes when it reduces then "
                          f"broadcasts, you returned {got_naive:g}")
        if not math.isclose(got_ring, ring, rel_tol=1e-9):
            expect(not math.isclose(got_ring, ring / 2, rel_tol=1e-9),
                   f"{call}: in the ring each device sends {ring} bytes, you returned "
                   f"{got_ring:g}: that is the reduce-scatter alone; the all-gather sends as "
                   "much again")
            expect(not math.isclose(got_ring, 2 * ring, rel_tol=1e-9),
                   f"{call}: in the ring each device sends {ring} bytes, you returned "
                   f"{got_ring:g}: its sends AND receives; count only what it sends")
            expect(False, f"{call}: in the ring each device sends {ring} bytes (counted), you "
                          f"returned {got_ring:g}")
    expect(len(seen) > 1, "bytes_sent returned the same pair for every input")
