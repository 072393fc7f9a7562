"""Checks for the exercises of Part IV's fixes chapter (book/part4/fixes.ipynb).

Allreduces are judged on CPU tensors for the values and on FakeGPUs (replica c on cuda:c) for
what crossed between devices: every copy, its size, its source and destination, and what each
device added. Formulas get fresh inputs, numbers of any real type, and tolerances from float
rounding.
"""
import collections
import math

import numpy as np
import torch

from ._core import (
    CheckFailed,
    FakeGPUs,
    as_int,
    as_number,
    check,
    describe_device,
    expect,
    fresh_generator,
    number_words,
    randint,
    same_number,
    tensor_equal,
    uniform,
)
from ._core.handed import in_place
from ._core.moved import PYTHON, carried, moves

__all__ = ["check_bucket_allreduce", "check_ring_allreduce", "check_amdahl_speedup"]


def _in_place(call, data, objs, ptrs, name="data"):
    """The given tensors kept (`handed.in_place`: no list entry rebound) and their storage."""
    fix = "write the sums INTO the given tensors (copy_, add_)"
    for i, orig in enumerate(in_place(call, data, objs, name, fix)):
        expect(orig.data_ptr() == ptrs[i], f"{call}: {name}[{i}] got new storage (.data = or "
                                           "set_): write the sums INTO the given tensors")


def _buckets(numels, itemsize, bucket_bytes):
    """The tensors' indices per bucket: consecutive tensors, closed once a bucket holds >=
    bucket_bytes."""
    out, cur, size = [], [], 0
    for i, n in enumerate(numels):
        cur.append(i)
        size += n
        if size * itemsize >= bucket_bytes:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def _bucket_sizes(numels, itemsize, bucket_bytes):
    """Elements per bucket (`_buckets`)."""
    return [sum(numels[i] for i in b) for b in _buckets(numels, itemsize, bucket_bytes)]


def _bucket_case(g, dtype):
    """Tensor shapes and a bucket size whose buckets hold two tensors or more, none of a single
    tensor's size, that differ from buckets closed at '>' or filled from the end."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    for _ in range(200):
        shapes = [(randint(g, 2, 40),) if randint(g, 0, 1) else (randint(g, 2, 6),
                                                                  randint(g, 2, 6))
                  for _ in range(randint(g, 6, 9))]
        numels = [math.prod(s) for s in shapes]
        cut = randint(g, 2, 3)
        bucket_bytes = itemsize * sum(numels[:cut])          # a bucket closes exactly here
        want = _bucket_sizes(numels, itemsize, bucket_bytes)
        wrong = [_bucket_sizes(numels, itemsize, bucket_bytes + 1),
                 _bucket_sizes(numels[::-1], itemsize, bucket_bytes),
                 _bucket_sizes(numels, 1, bucket_bytes), _bucket_sizes(numels, 4, bucket_bytes)]
        if (len(want) >= 2 and not set(numels) & set(want) and sum(numels) not in want
                and all(collections.Counter(w) != collections.Counter(want) for w in wrong
                        if w is not wrong[3] or itemsize != 4)):
            return shapes, bucket_bytes, want
    raise RuntimeError("no bucket case drawn")


def _gradient(g, shape, dtype):
    """Whole numbers for float32 (every sum exact in any order); real values for float64, which
    float32 cannot hold, so that a buffer made in float32 on the way shows."""
    if dtype == torch.float64:
        return torch.randn(shape, generator=g, dtype=dtype) / 3
    return torch.randint(-9, 10, shape, generator=g).to(dtype)


@check("bucket_allreduce", simulated=True, changes_inputs=True, references=["bucketed_allreduce"],
       observes=[
    "on CPU tensors: every gradient (the same objects, the same storage) holds the sum over "
    "the replicas, for k = 1, 2, 3 and float32 (whole numbers) and float64 (values float32 "
    "cannot hold)",
    "on k simulated GPUs (replica c on cuda:c): every copy between devices, by whose elements "
    "it carries (followed through cat, views, chunks and additions), not by its size: each must "
    "carry one bucket's flat buffer, whole or a chunk of it (a ring), and every bucket "
    "(consecutive tensors, closed once it holds at least bucket_bytes bytes) must travel; no "
    "tensor of a larger bucket alone, no copy mixing buckets, no one buffer of all sent whole "
    "(one flat buffer of every gradient, reduced bucket by bucket in its ranges, passes)",
    "where the sum is computed (one device, every device, the host) is not judged: the lesson is "
    "what travels, judged per bucket"])
def check_bucket_allreduce(bucket_allreduce):
    """bucket_allreduce(grads, bucket_bytes): grads[c] = list of tensors of replica c, summed over
    the replicas in place, one flat buffer per bucket of consecutive tensors."""
    g = fresh_generator()
    for k, dtype in ((1, torch.float32), (2, torch.float32), (3, torch.float32),
                     (2, torch.float64)):
        shapes, bucket_bytes, want = _bucket_case(g, dtype)
        grads = [[_gradient(g, s, dtype) for s in shapes] for _ in range(k)]
        before = [[t.clone() for t in r] for r in grads]
        call = (f"bucket_allreduce(grads of {k} replica{'s' if k > 1 else ''}, "
                f"{bucket_bytes}) ({len(shapes)} {str(dtype).split('.')[-1]} tensors)")
        objs = [list(r) for r in grads]
        ptrs = [[t.data_ptr() for t in r] for r in grads]
        bucket_allreduce(grads, bucket_bytes)
        sums = [sum(before[c][i] for c in range(k)) for i in range(len(shapes))]
        for c in range(k):
            _in_place(call, grads[c], objs[c], ptrs[c], f"grads[{c}]")
            for i, s in enumerate(sums):       # float64: two addends, any order is exact
                expect(tensor_equal(objs[c][i], s), f"{call}: replica {c}'s tensor {i} does not "
                                                   "hold the sum over the replicas" + (
                                                       " in float64 (a float32 buffer on the "
                                                       "way rounds it: keep the gradients' dtype)"
                                                       if dtype == torch.float64 else ""))
        if k > 1:
            _bucket_traffic(bucket_allreduce, before, bucket_bytes, want, call)


def _bucket_traffic(fn, before, bucket_bytes, want, call):
    """Every move between devices carries one bucket: judged by whose elements it carries (a
    ring's chunk of a bucket's flat buffer carries that bucket), not by its size."""
    k, numels = len(before), [t.numel() for t in before[0]]
    buckets = _buckets(numels, before[0][0].element_size(), bucket_bytes)
    bucket_of = {i: b for b, idx in enumerate(buckets) for i in idx}
    gpus = FakeGPUs(k)
    fakes = [[gpus.tensor(t, c) for t in r] for c, r in enumerate(before)]
    _, rec = gpus.run(fn, fakes, bucket_bytes, what=call)
    moved = carried(rec, {(c, i): t for c, r in enumerate(fakes) for i, t in enumerate(r)})
    expect(moved, f"{call}: nothing crossed between the devices")
    rule = (f"a bucket takes consecutive tensors from the first and closes as soon as it holds "
            f"at least bucket_bytes = {bucket_bytes} bytes (numel * element_size), the last may "
            f"be smaller: here tensors {buckets} ({want} elements)")
    crossed = [0] * len(buckets)
    for src, dst, size, names, made, buffer in moved:
        where = f"{describe_device(src)} sent {size} elements to {describe_device(dst)}"
        per = collections.defaultdict(set)          # replica -> its tensors the move carries
        for name in names:
            if name != PYTHON:
                per[name[0]].add(name[1])
        within = collections.defaultdict(set)       # replica -> its tensors the buffer holds
        for name in buffer - {PYTHON}:
            within[name[0]].add(name[1])
        if not per:
            expect(not made, f"{call}: {where}, computed from the gradients by a product: "
                             "send each bucket's flat buffer itself (torch.cat of its tensors)")
            continue
        got = set().union(*per.values())
        if len(got) == len(numels):
            raise CheckFailed(f"{call}: one buffer of all {len(numels)} tensors crossed between "
                              f"the devices ({where}): form buckets instead; {rule}")
        hit = sorted({bucket_of[i] for i in got})
        expect(len(hit) == 1, f"{call}: {where} holding tensors {sorted(got)}, parts of "
                              f"{len(hit)} buckets: {rule}")
        whole = set(buckets[hit[0]])    # a chunk of a buffer holding the bucket: a ring's
        part = None if any(whole <= t for t in within.values()) else min(
            (sorted(t) for t in per.values() if t != whole), default=None)
        if part and len(part) == 1:
            raise CheckFailed(f"{call}: {where} of tensor {part[0]} alone, but its bucket holds "
                              f"tensors {buckets[hit[0]]}: those are single tensors; copy each "
                              "bucket's tensors into one flat buffer per replica (torch.cat) and "
                              "send that, whole or in chunks")
        expect(not part, f"{call}: {where} holding tensors {part}, part of the bucket of "
                         f"tensors {buckets[hit[0]]}: {rule}")
        crossed[hit[0]] += size
    short = [buckets[b] for b, n in enumerate(crossed) if n < (k - 1) * want[b]]
    expect(not short, f"{call}: the buckets of tensors {short} never crossed between all the "
                      "devices: reduce every bucket")


@check("ring_allreduce", simulated=True, changes_inputs=True,
       references=["ring_allreduce", "ring_reduce_scatter", "ring_all_gather"],
       observes=[
    "on CPU tensors (1-D and 2-D, 2 rows on 3 devices in every call; sizes k divides for one k "
    "and no other): every tensor (the same object, the same storage) holds the sum",
    "on k simulated GPUs (tensor i on cuda:i): every copy between devices, its source, "
    "destination and size: only between neighbours of the ring, one chunk (about n/k) at a "
    "time, 2(k-1)n elements in all, and each device's additions at most k-1 chunks",
    "the counts returned against the elements the check saw each device send"])
def check_ring_allreduce(ring_allreduce):
    """ring_allreduce(data) in place by a reduce-scatter then an all-gather over k chunks;
    returns the elements each device sent."""
    g = fresh_generator()
    even = randint(g, 2, 5)      # the one k > 1 that divides its size (equal chunks)
    for k in (1, 2, 3, 4, 5):
        n = k * randint(g, 2, 9) + (randint(g, 1, k - 1) if k not in (1, even) else 0)
        if k == (5 if even == 4 else 4):      # forced: torch.chunk makes fewer than k chunks
            n = 2 * k + 1
        if k == 3 and n % 2:     # forced: 3 tensors of 2 rows, where chunks of rows are not
            n += 3               # chunks of the elements (n % 3 kept)
        shape = (n,) if k % 2 == 0 or n % 2 else (2, n // 2)
        n = math.prod(shape)
        data = [torch.randint(-9, 10, shape, generator=g).float() for _ in range(k)]
        before = [t.clone() for t in data]
        call = f"ring_allreduce({k} tensors of shape {tuple(shape)})"
        objs, ptrs = list(data), [t.data_ptr() for t in data]
        sent = ring_allreduce(data)
        total = torch.stack(before).sum(0)          # after the answer ran
        _in_place(call, data, objs, ptrs)
        for i, t in enumerate(objs):
            expect(tensor_equal(t, total), f"{call}: tensor {i} does not hold the sum"
                   + ("" if k == 1 or tensor_equal(objs[0], total) else "; after the "
                      "reduce-scatter each device holds one summed chunk: the all-gather "
                      "passes them round the ring"))
        kind = ("a tensor" if isinstance(sent, torch.Tensor) else
                "a numpy array" if isinstance(sent, np.ndarray) else None)
        expect(kind is None, f"{call} returned {kind} ({sent.tolist() if kind else ''}): "
                             f"return a list (not {kind}) of {k} int{'s' * (k > 1)}, one per "
                             "device")
        expect(isinstance(sent, (list, tuple)) and len(sent) == k,
               f"{call} returned {sent!r}: return a list of {k} count{'s' * (k > 1)}, one per "
               "device")
        sent = [as_int(s, f"{call}[{i}]") for i, s in enumerate(sent)]
        seen = _ring_traffic(ring_allreduce, before, call) if k > 1 else [0]
        for i, (a, b) in enumerate(zip(sent, seen, strict=True)):
            expect(a == b, f"{call}: you report device {i} sent {a} elements, but it sent {b} "
                           f"(all: {seen}); count the elements each device passes on")


def _ring_traffic(fn, before, call):
    """The elements each device sent, on simulated GPUs, checked against what a ring sends."""
    k, n = len(before), before[0].numel()
    chunk = -(-n // k)
    gpus = FakeGPUs(k)
    fakes = [gpus.tensor(t, i) for i, t in enumerate(before)]
    _, rec = gpus.run(fn, list(fakes), what=call)
    sent = [0] * k
    for src, dst, size, _ in moves(rec):
        expect(src.type != "cuda" or dst.type == "cuda",
               f"{call}: {describe_device(src)} sent {size} elements to the host: in a ring the "
               "data stays on the devices, each passing chunks to its neighbour")
        if src.type != "cuda":      # a buffer made on the host and moved: no device sent it
            continue
        a, b = src.index, dst.index
        expect(b in ((a + 1) % k, (a - 1) % k),
               f"{call}: {describe_device(src)} sent {size} elements to {describe_device(dst)}: "
               "in a ring each device sends only to its neighbour")
        expect(size <= chunk,
               f"{call}: {describe_device(src)} sent {size} elements at once to "
               f"{describe_device(dst)}" + (" (the whole tensor)" if size == n else "") +
               f": each step passes one chunk of about n/k = {n / k:.1f} elements "
               "(t.view(-1).tensor_split(k))")
        sent[a] += size
    expect(sum(sent) == 2 * (k - 1) * n,
           f"{call}: the devices sent {sum(sent)} elements in all ({sent}); a ring sends "
           f"2(k-1)n = {2 * (k - 1) * n}: k-1 chunks each in the reduce-scatter, k-1 in the "
           "all-gather")
    adds = rec.adds_by_device()
    for d in gpus.devices:
        expect(adds.get(d, 0) <= (k - 1) * chunk,
               f"{call}: {describe_device(d)} added {adds.get(d, 0)} elements; in a ring each "
               f"device adds only the k-1 chunks it receives in the reduce-scatter (at most "
               f"{(k - 1) * chunk})")
    return sent


@check("amdahl_speedup", observes=[
    "the number returned for fresh shares and fixes of some of the phases (and none), against "
    "1 / the sum of share / factor, to float rounding"])
def check_amdahl_speedup(amdahl_speedup):
    """amdahl_speedup(shares, factors) -> overall speed-up when phase i (share of the time
    shares[i]) becomes factors[i] times faster (phases not in factors unchanged)."""
    g = fresh_generator()
    names = ["data", "copy", "compute", "allreduce", "sgd"]
    for fixed in (1, 2, 3, 0):
        w = [uniform(g, 0.05, 1.0) for _ in names]
        shares = {n: x / math.fsum(w) for n, x in zip(names, w, strict=True)}
        picked = [names[i] for i in torch.randperm(len(names), generator=g)[:fixed].tolist()]
        factors = {n: uniform(g, 1.5, 20.0) for n in picked}
        call = ("amdahl_speedup(shares, "
                + "{" + ", ".join(f"{n!r}: {f:.3g}" for n, f in factors.items()) + "})")
        got, dtype = as_number(amdahl_speedup(dict(shares), dict(factors)), call,
                               with_dtype=True)
        want = 1 / math.fsum(s / factors.get(n, 1.0) for n, s in shares.items())
        if same_number(got, want, dtype, 2 * len(names) + 2):
            continue
        hint = " (the step's time left is the sum of share / factor)"
        only = math.fsum(shares[n] / f for n, f in factors.items())
        if factors and same_number(got, 1 / only, dtype, 2 * len(names) + 2):
            hint = ": the phases not in factors still take their share of the time"
        elif not factors:
            hint = ": no fix, no speed-up"
        got_s, want_s = number_words(got, want, dtype)
        expect(False, f"{call} returned {got_s}, expected {want_s}{hint}")
