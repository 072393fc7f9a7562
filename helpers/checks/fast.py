"""Checks for the exercises of Part IV's profile and fixes chapters (scaling: scaling.py).

A timer is judged on simulated GPUs that run asynchronously: fn() only queues work, and the work
is done when a synchronize of its device returns, so the check sees whether and when the answer
waited, and what the calls really took. Allreduces are judged on CPU tensors for the values and
on FakeGPUs (replica c on cuda:c) for what crossed between devices: every copy, its size, its
source and destination. Formulas get fresh inputs, numbers of any real type, and tolerances from
float rounding.
"""
import collections
import contextlib
import math
import statistics
import time

import torch

from ._core import (CheckFailed, FakeGPUs, as_int, as_number, check, describe_device, expect,
                    fresh_generator, randint, rel_close, uniform)

__all__ = ["check_time_it", "check_time_shares", "check_predicted_speedup",
           "check_bucket_allreduce", "check_ring_allreduce", "check_amdahl_speedup"]


# --- profile.ipynb ----------------------------------------------------------------------------
class _AsyncGPUs:
    """Simulated GPUs that run asynchronously, as CUDA does: `queue(i, work)` returns at once,
    and `synchronize(d)` (torch.cuda.synchronize, which helpers.synchronize calls) sleeps until
    d's queued work is done. Records the calls of fn and the synchronizations, in order."""

    def __init__(self, devices):
        self.devices = devices
        self.busy = {d: 0.0 for d in devices}        # when each device's queue runs dry
        self.events = []                              # ("call", i, t) and ("sync", device, t)
        self.starts = []

    def queue(self, work):
        now = time.perf_counter()
        for d, seconds in work.items():
            self.busy[d] = max(self.busy[d], now) + seconds

    def call(self, work):
        i = len(self.starts)
        self.starts.append(time.perf_counter())
        self.events.append(("call", i, self.starts[-1]))
        self.queue(work)

    def synchronize(self, device=None):
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(
            device if device is not None else "cuda")
        d = torch.device("cuda", d.index or 0) if d.type == "cuda" else d
        wait = self.busy.get(d, 0.0) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.events.append(("sync", d, time.perf_counter()))

    @contextlib.contextmanager
    def active(self):
        saved = [(torch.cuda, "synchronize", torch.cuda.synchronize)]
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "synchronize"):
            saved.append((accelerator, "synchronize", accelerator.synchronize))
        for owner, name, _ in saved:
            setattr(owner, name, self.synchronize)
        try:
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    def unsynced(self, gpus, earlier):
        """For each call of fn: the GPUs not synchronized between it and the next call (or the
        end), then the GPUs of `earlier` work not synchronized before the first call:
        [(call index or -1, [devices])]."""
        out, since, call = [], set(), -1
        for kind, what, _ in self.events + [("call", None, None)]:
            if kind == "sync":
                since.add(what)
            else:
                missing = [d for d in (gpus if call >= 0 else earlier) if d not in since]
                if missing:
                    out.append((call, missing))
                since, call = set(), what
        return sorted(out, key=lambda item: item[0] < 0)

    def durations(self, gpus):
        """What each call really took: from its start to the return of the synchronize that
        found the last of its work done, on every GPU."""
        out = []
        for i, start in enumerate(self.starts):
            at = next(j for j, e in enumerate(self.events) if e[:2] == ("call", i))
            ends = []
            for d in gpus:
                ends.append(next((e[2] for e in self.events[at:] if e[:2] == ("sync", d)),
                                 math.inf))
            out.append(max(ends) - start)
        return out


def _ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


@check("time_it", references=["Timer", "measure"], observes=[
    "on 2 or 3 simulated GPUs that run asynchronously (fn() only queues work; "
    "torch.cuda.synchronize, which helpers.synchronize calls, waits for it): which GPUs were "
    "synchronized before the first call and after every call, before the next one",
    "the seconds returned against the median of what the calls really took (one of them much "
    "slower than the others, so median, mean and total are far apart), measured by the check"])
def check_time_it(time_it):
    """time_it(fn, devices, reps) -> median seconds of one call of fn, the devices synchronized
    before the clock starts and before it stops. Robust on a loaded machine: the check compares
    with the durations that really happened, not with the work it queued."""
    g = fresh_generator()
    for _ in range(2):
        k, reps = randint(g, 2, 3), randint(g, 3, 6)
        gpus = [torch.device("cuda", i) for i in range(k)]
        devices = list(gpus) + ([torch.device("cpu")] if randint(g, 0, 1) else [])
        slow = randint(g, 0, reps - 1)                # which call is the slow one
        sim = _AsyncGPUs(gpus)

        def fn():
            i = len(sim.starts)
            last = 0.06 if i == slow else 0.006       # the longest work on the last GPU
            sim.call({d: (last if d == gpus[-1] else 0.002) for d in gpus})
        call = f"time_it(fn, {[str(d) for d in devices]}, {reps})"
        earlier = [gpus[randint(g, 0, k - 1)]]
        with sim.active():
            sim.queue({earlier[0]: 0.03})             # earlier work, still running
            t = as_number(time_it(fn, list(devices), reps), call)
        n = len(sim.starts)
        expect(n >= reps, f"{call} called fn {n} times, expected reps = {reps}")
        warm = n > reps            # a warm-up call ran the earlier work out before timing
        for i, missing in sim.unsynced(gpus, [] if warm else earlier):
            names = " and ".join(map(describe_device, missing))
            if i < 0:
                expect(False, f"{call} started timing while {names} still ran earlier work: "
                              "synchronise the devices before starting the clock "
                              "(helpers.synchronize(devices))")
            expect(False, f"{call}: the work that fn queued on {names} in call {i + 1} was "
                          "never waited for before " + ("the next call" if i < n - 1 else
                                                  f"{call.split('(')[0]} returned") +
                          ": GPUs run asynchronously; synchronise every device in devices "
                          "after fn() and before stopping the clock (helpers.synchronize)")
        real = sim.durations(gpus)
        med, mean, total = statistics.median(real), statistics.fmean(real), sum(real)
        expect(not math.isclose(t, 1e3 * med, rel_tol=0.5),
               f"{call} says {t:g}: that looks like milliseconds; return seconds")
        expect(t >= 0.5 * min(real),
               f"{call} says {_ms(t)}, but every call took at least {_ms(min(real))} until its "
               "work was done: the clock stopped before the devices finished; synchronise "
               "before stopping the clock, not after")
        expect(not math.isclose(t, total, rel_tol=0.2),
               f"{call} says {_ms(t)}, the total of all {n} calls ({_ms(total)}); return the "
               "median of per-call times")
        expect(abs(t - med) < abs(t - mean) and t >= 0.9 * min(real),
               f"{call} says {_ms(t)}, but the calls took {_ms(med)} (median) and {_ms(mean)} "
               "(mean; one call is slow): return the median of per-call times, in seconds")


def _mapping(value, call):
    expect(isinstance(value, dict), f"{call} returned {type(value).__name__}, expected a dict")
    return value


@check("time_shares", observes=[
    "the dict returned for fresh phase times (a random subset of the phases): its keys, their "
    "order (largest first) and each share against seconds / total, to float rounding"])
def check_time_shares(time_shares):
    """time_shares(seconds: dict) -> dict name -> fraction of the total, largest first."""
    g = fresh_generator()
    names = ["data", "copy", "forward", "backward", "allreduce", "sgd"]
    for _ in range(3):
        picked = [n for n in names if randint(g, 0, 3)] or names[:2]
        secs = {n: uniform(g, 0.001, 0.2) for n in picked}
        total = math.fsum(secs.values())
        call = "time_shares({" + ", ".join(f"{n!r}: {v:.4g}" for n, v in secs.items()) + "})"
        out = _mapping(time_shares(dict(secs)), call)
        expect(set(out) == set(secs), f"{call} returned the keys {sorted(out)}, expected "
                                      f"{sorted(secs)}")
        for name, v in secs.items():
            got, dtype = as_number(out[name], f"{call}[{name!r}]", with_dtype=True)
            if rel_close(got, v / total, len(secs) + 2, dtype):
                continue
            hint = ""
            if rel_close(got, 100 * v / total, len(secs) + 3, dtype):
                hint = ": that is a percentage; return the fraction (between 0 and 1)"
            elif rel_close(got, v, 1, dtype):
                hint = ": that is its time; divide by the total of all phases"
            expect(False, f"{call}: the share of {name!r} is {got:.6g}, expected "
                          f"{v / total:.6g}{hint}")
        expect(list(out) == sorted(secs, key=secs.get, reverse=True),
               f"{call}: the keys come in the order {list(out)}; order them largest share "
               "first")


@check("predicted_speedup", observes=[
    "the number returned for fresh (compute, all-reduce, k), k = 1 and an all-reduce longer "
    "than the step, against one worker's step over a k-worker step (compute/k plus the "
    "all-reduce), to float rounding"])
def check_predicted_speedup(predicted_speedup):
    """predicted_speedup(compute_s, comm_s, k) -> speed-up of k workers over one, when one
    worker's step is compute_s of compute, k workers split it evenly, and each of their steps
    adds comm_s of all-reduce (one worker has nothing to reduce)."""
    g = fresh_generator()
    cases = [(uniform(g, 1e-3, 0.1), uniform(g, 1e-4, 0.05), randint(g, 2, 16))
             for _ in range(6)]
    cases += [(uniform(g, 1e-3, 0.1), uniform(g, 1e-4, 0.05), 1)]
    compute = uniform(g, 1e-3, 5e-3)
    cases += [(compute, uniform(g, 2, 5) * compute, 2)]          # two workers lose
    for compute, comm, k in cases:
        call = f"predicted_speedup({compute:.4g}, {comm:.4g}, {k})"
        want = 1.0 if k == 1 else compute / (compute / k + comm)
        got, dtype = as_number(predicted_speedup(compute, comm, k), call, with_dtype=True)
        if rel_close(got, want, 8, dtype):
            continue
        hint = " (one worker's step over a k-worker step)"
        if k == 1:
            hint = ": one worker does not communicate: its speed-up over itself is 1"
        elif rel_close(got, k, 8, dtype):
            hint = (f": that is the ideal k; every worker also pays the all-reduce "
                    f"({comm * 1e3:.2f} ms a step)")
        elif rel_close(got, compute / (compute + comm), 8, dtype):
            hint = (": that charges the all-reduce but never splits the compute; each worker "
                    "computes 1/k of the batch")
        expect(False, f"{call} returned {got:.6g}, expected {want:.6g}{hint}")


# --- fixes.ipynb ------------------------------------------------------------------------------
def _moves(rec):
    """(source device, destination device, elements) of every copy between devices."""
    out = []
    for op in rec.transfers():
        src = op.reads[-1 if op.name == "copy_" else 0]
        dst = (op.writes or op.outputs)[0]
        out.append((src.device, dst.device, src.numel))
    return out


def _in_place(call, data, objs, ptrs, what="tensor"):
    for i, (t, orig) in enumerate(zip(data, objs)):
        expect(t is orig, f"{call}: {what} {i} was replaced in the list: write the sums INTO "
                          "the given tensors (copy_, add_), they are the replicas' gradients")
        expect(orig.data_ptr() == ptrs[i], f"{call}: {what} {i} got new storage (.data = or "
                                           "set_): write the sums INTO the given tensors")


def _bucket_sizes(numels, itemsize, bucket_bytes):
    """Elements per bucket: consecutive tensors, closed once a bucket holds >= bucket_bytes."""
    out, cur = [], 0
    for n in numels:
        cur += n
        if cur * itemsize >= bucket_bytes:
            out.append(cur)
            cur = 0
    return out + ([cur] if cur else [])


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


@check("bucket_allreduce", references=["bucketed_allreduce"], observes=[
    "on CPU tensors: every gradient (the same objects, the same storage) holds the sum over "
    "the replicas, for k = 1, 2, 3 and float32 and float64",
    "on k simulated GPUs (replica c on cuda:c): every copy between devices, and its size: each "
    "must carry one bucket's flat buffer, and every bucket (consecutive tensors, closed once it "
    "holds at least bucket_bytes bytes) must travel; no tensor alone, no one buffer of all"])
def check_bucket_allreduce(bucket_allreduce):
    """bucket_allreduce(grads, bucket_bytes): grads[c] = list of tensors of replica c, summed over
    the replicas in place, one flat buffer per bucket of consecutive tensors."""
    g = fresh_generator()
    for k, dtype in ((1, torch.float32), (2, torch.float32), (3, torch.float32),
                     (2, torch.float64)):
        shapes, bucket_bytes, want = _bucket_case(g, dtype)
        grads = [[torch.randint(-9, 10, s, generator=g).to(dtype) for s in shapes]
                 for _ in range(k)]
        before = [[t.clone() for t in r] for r in grads]
        sums = [sum(before[c][i] for c in range(k)) for i in range(len(shapes))]
        call = (f"bucket_allreduce(grads of {k} replica{'s' if k > 1 else ''}, "
                f"{bucket_bytes}) ({len(shapes)} {str(dtype).split('.')[-1]} tensors)")
        objs = [list(r) for r in grads]
        ptrs = [[t.data_ptr() for t in r] for r in grads]
        bucket_allreduce(grads, bucket_bytes)
        for c in range(k):
            _in_place(call, grads[c], objs[c], ptrs[c], f"replica {c}'s tensor")
            for i, s in enumerate(sums):
                expect(torch.equal(objs[c][i], s), f"{call}: replica {c}'s tensor {i} does not "
                                                   "hold the sum over the replicas")
        if k > 1:
            _bucket_traffic(bucket_allreduce, before, bucket_bytes, want, call)


def _bucket_traffic(fn, before, bucket_bytes, want, call):
    k = len(before)
    gpus = FakeGPUs(k)
    fakes = [[gpus.tensor(t, c) for t in r] for c, r in enumerate(before)]
    _, rec = gpus.run(fn, fakes, bucket_bytes, what=call)
    sizes = [n for _, _, n in _moves(rec)]
    numels = [t.numel() for t in before[0]]
    total = sum(numels)
    expect(sizes, f"{call}: nothing crossed between the devices")
    if total in sizes:
        raise CheckFailed(f"{call}: one buffer of all {total} elements crossed between the "
                          f"devices: form buckets of consecutive tensors, each closed once it "
                          f"holds at least bucket_bytes = {bucket_bytes} bytes (numel * "
                          f"element_size; here {want} elements)")
    odd = [n for n in sizes if n not in want]
    if odd:
        hint = ""
        if all(n in numels for n in odd):
            hint = (": those are single tensors; copy each bucket's tensors into one flat "
                    "buffer per replica (torch.cat) and send that")
        raise CheckFailed(f"{call}: buffers of {sorted(set(odd))} elements crossed between the "
                          f"devices, but the buckets hold {want} elements: a bucket takes "
                          f"consecutive tensors from the first and closes as soon as it holds "
                          f"at least bucket_bytes bytes (numel * element_size), the last may be "
                          f"smaller{hint}")
    seen, need = collections.Counter(sizes), collections.Counter(want)
    short = [n for n in need if seen[n] < need[n] * (k - 1)]
    expect(not short, f"{call}: the buckets of {short} elements never crossed between all "
                      "the devices: reduce every bucket")


@check("ring_allreduce", references=["ring_allreduce"], observes=[
    "on CPU tensors (sizes no k divides, 1-D and 2-D): every tensor (the same object, the same "
    "storage) holds the sum",
    "on k simulated GPUs (tensor i on cuda:i): every copy between devices, its source, "
    "destination and size: only between neighbours of the ring, one chunk (about n/k) at a "
    "time, 2(k-1)n elements in all, and each device's additions at most k-1 chunks",
    "the counts returned against the elements the check saw each device send"])
def check_ring_allreduce(ring_allreduce):
    """ring_allreduce(data) in place by a reduce-scatter then an all-gather over k chunks;
    returns the elements each device sent."""
    g = fresh_generator()
    for k in (1, 2, 3, 4, 5):
        n = k * randint(g, 2, 9) + (randint(g, 1, k - 1) if k > 1 else 0)
        shape = (n,) if k % 2 == 0 or n % 2 else (2, n // 2)
        n = math.prod(shape)
        data = [torch.randint(-9, 10, shape, generator=g).float() for _ in range(k)]
        before = [t.clone() for t in data]
        total = torch.stack(before).sum(0)
        call = f"ring_allreduce({k} tensors of shape {tuple(shape)})"
        objs, ptrs = list(data), [t.data_ptr() for t in data]
        sent = ring_allreduce(data)
        _in_place(call, data, objs, ptrs)
        for i, t in enumerate(objs):
            expect(torch.equal(t, total), f"{call}: tensor {i} does not hold the sum"
                   + ("" if k == 1 or torch.equal(objs[0], total) else "; after the "
                      "reduce-scatter each device holds one summed chunk: the all-gather "
                      "passes them round the ring"))
        expect(isinstance(sent, (list, tuple)) and len(sent) == k,
               f"{call} returned {sent!r}: return a list of {k} counts, one per device")
        sent = [as_int(s, f"{call}[{i}]") for i, s in enumerate(sent)]
        seen = _ring_traffic(ring_allreduce, before, call) if k > 1 else [0]
        for i, (a, b) in enumerate(zip(sent, seen)):
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
    for src, dst, size in _moves(rec):
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
        shares = {n: x / math.fsum(w) for n, x in zip(names, w)}
        picked = [names[i] for i in torch.randperm(len(names), generator=g)[:fixed].tolist()]
        factors = {n: uniform(g, 1.5, 20.0) for n in picked}
        want = 1 / math.fsum(s / factors.get(n, 1.0) for n, s in shares.items())
        call = ("amdahl_speedup(shares, "
                + "{" + ", ".join(f"{n!r}: {f:.3g}" for n, f in factors.items()) + "})")
        got, dtype = as_number(amdahl_speedup(dict(shares), dict(factors)), call,
                               with_dtype=True)
        if rel_close(got, want, 2 * len(names) + 2, dtype):
            continue
        hint = " (the step's time left is the sum of share / factor)"
        only = math.fsum(shares[n] / f for n, f in factors.items())
        if factors and rel_close(got, 1 / only, 2 * len(names) + 2, dtype):
            hint = ": the phases not in factors still take their share of the time"
        elif not factors:
            hint = ": no fix, no speed-up"
        expect(False, f"{call} returned {got:.6g}, expected {want:.6g}{hint}")
