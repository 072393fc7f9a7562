"""Checks for the exercises of Part I's data-parallel chapter: combining mean-loss gradients,
aggregate-then-broadcast in place (placed on simulated GPUs), the bytes of two all-reduces, a
parameter server sharded over the devices, gradient accumulation on one device.

The device exercises run twice: on CPU tensors for the values, and on FakeGPUs (cuda:0..k-1),
where the Recorder sees which device ran each operation and what flowed where. A recording net
shows what a one-device answer fed its model."""
import collections

import torch

from .. import ByteLog, loss, ring_allreduce, send
from ._core import (
    FakeGPUs,
    Recorder,
    as_pair,
    check,
    describe_device,
    expect,
    fresh_generator,
    near,
    randint,
    shown,
    tensor_close,
)
from ._core.inputs import expect_unchanged, kept
from ._core.moved import moves
from ._core.recorded import Taps

__all__ = ["check_combine_mean_grads", "check_reduce_then_broadcast",
           "check_bytes_sent_naive_vs_ring", "check_sharded_server_step", "check_accumulated_step"]

CPU = torch.device("cpu")


def _close(got, want):
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and tensor_close(got.detach().double().cpu(), want.double(), rtol=1e-5, atol=1e-6))


# handed copies, compared with the check's own tensors: combining in place (not forbidden) passes
@check("combine_mean_grads", changes_inputs=True, observes=[
    "the tensor returned for fresh shard gradients (copies, which it may write into) and "
    "unequal shard sizes, against the full batch's mean-loss gradient"])
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
        want = sum(gr * s for gr, s in zip(grads, sizes, strict=True)) / sum(sizes)
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


# `g.data = total` re-points every replica's .grad at one tensor: on the CPU they share it (the
# next backward accumulating into one changes all), on GPUs all move to device 0 with no copy
_OWN_STORAGE = ("got new storage (.data = or set_()): each device keeps its own gradient, in its "
                "own memory; copy the sum INTO it (g.copy_(total), which moves it to g's device)")


@check("reduce_then_broadcast", simulated=True, changes_inputs=True,
       references=["allreduce", "ring_allreduce", "flat_allreduce",
                   "bucketed_allreduce"], observes=[
    "on CPU tensors: afterwards every tensor of the list (the same objects, the same storage) "
    "holds the sum",
    "on k simulated GPUs (tensor i on cuda:i): no operation mixed devices, every device's "
    "tensor keeps its storage on its device and ends up computed from every device's gradient "
    "(the sum travelled to each), and the additions they came from are no more than one "
    "reduction's (k - 1 gradients, plus one)"])
def check_reduce_then_broadcast(fn):
    """fn(grads): steps 3 and 4, in place: afterwards every tensor in `grads` holds their sum."""
    g = fresh_generator()
    for trial in range(3):
        k = randint(g, 3 if trial == 0 else 2, 5)   # 3 or more once: see the adds below
        grads = [torch.randn(4, 3, generator=g) for _ in range(k)]
        originals, own = list(grads), [gr.clone() for gr in grads]
        ptrs = [gr.data_ptr() for gr in grads]
        call = f"reduce_then_broadcast on {k} devices"
        fn(grads)
        want = sum(own)
        for i, orig in enumerate(originals):
            if grads[i] is not orig and tensor_close(grads[i], want, atol=1e-5):
                expect(tensor_close(orig, want, atol=1e-5),
                       f"{call}: tensor {i} of the list was replaced by a new tensor; the "
                       "device's own gradient still holds its local value: write into it in "
                       "place (copy_)")
            expect(tensor_close(orig, want, atol=1e-5),
                   f"{call}: tensor {i} does not hold the sum of the {k} gradients" + (
                       " (it still holds its own gradient)" if tensor_close(orig, own[i])
                       else ""))
            expect(orig.data_ptr() == ptrs[i], f"{call}: tensor {i} " + _OWN_STORAGE)
        gpus = FakeGPUs(k)
        fakes = [gpus.tensor(gr, i) for i, gr in enumerate(own)]
        keys = [(f.untyped_storage()._cdata, 0) for f in fakes]
        _, rec = gpus.run(fn, list(fakes), what=call)
        for i, f in enumerate(fakes):
            expect(f.untyped_storage()._cdata == keys[i][0] and f.device == gpus.devices[i],
                   f"{call}: the gradient of {describe_device(gpus.devices[i])} (now on "
                   f"{describe_device(f.device)}) " + _OWN_STORAGE)
        for i, f in enumerate(fakes):
            read = {(r.key, r.version) for op in rec.ancestors(f) for r in op.reads}
            missing = [j for j, key in enumerate(keys) if j != i and key not in read]
            expect(not missing, f"{call}: the gradient on {describe_device(gpus.devices[i])} "
                                f"never received the sum: the gradients of device "
                                f"{', '.join(map(str, missing))} did not reach it (add them up on "
                                "device 0, then copy the sum into every device's tensor)")
        # the additions the results came from: reducing once adds k - 1 gradients' elements
        # (Python's sum's `0 + g` is none: observe.py); every device summing all k for itself adds
        # k (k - 1): more from 3 devices on (work off the path, an assert's norm, not counted)
        path = {op.index: op for f in fakes for op in rec.ancestors(f)}
        adds, n = sum(rec.adds_by_device(path.values()).values()), own[0].numel()
        expect(adds <= k * n, f"{call}: the devices added {adds / n:g} gradients' worth of "
                              f"elements where one reduction adds {k - 1}: sum the gradients "
                              "once (on device 0), then copy the sum into every device's "
                              "tensor, rather than every device summing them for itself")


def _naive_allreduce(xs, devices, log):
    """Reduce to device 0, then broadcast from it (steps 3 and 4 of data_parallel), logged."""
    total = sum(send(x, i, 0, devices, log, "reduce") for i, x in enumerate(xs))
    return [send(total, 0, i, devices, log, "broadcast") for i in range(len(xs))]


@check("bytes_sent_naive_vs_ring", references=["ring_bytes_per_device", "ring_allreduce",
                                              "ring_reduce_scatter", "ring_all_gather"],
       observes=[
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
        call = f"bytes_sent({nbytes}, {k})"
        (got_naive, got_ring), dtype = as_pair(fn(nbytes, k), call,
                                               "naive device 0, ring per device", True)
        log_naive = ByteLog()
        _naive_allreduce(xs, [CPU] * k, log_naive)
        naive = log_naive.wire_bytes(src=0)
        ring = ring_allreduce([x.clone() for x in xs])[0] * xs[0].element_size()
        seen.add((got_naive, got_ring))
        if not near(got_naive, naive, dtype, 16, 0.0):
            expect(got_naive != 2 * naive, f"{call}: device 0 sends {naive} bytes, you "
                   f"returned {got_naive:g}, its sends AND receives: count only what it sends")
            expect(got_naive != nbytes * k, f"{call}: device 0 sends {naive} bytes: the sum "
                   f"goes to the {k - 1} OTHER devices, not to itself")
            expect(False, f"{call}: device 0 sends {naive} bytes when it reduces then "
                          f"broadcasts, you returned {shown(got_naive, naive, 6)[0]}")
        if not near(got_ring, ring, dtype, 16, 1e-9):
            expect(not near(got_ring, ring / 2, dtype, 16, 1e-9),
                   f"{call}: in the ring each device sends {ring} bytes, you returned "
                   f"{got_ring:g}: that is the reduce-scatter alone; the all-gather sends as "
                   "much again")
            expect(not near(got_ring, 2 * ring, dtype, 16, 1e-9),
                   f"{call}: in the ring each device sends {ring} bytes, you returned "
                   f"{got_ring:g}: its sends AND receives; count only what it sends")
            expect(False, f"{call}: in the ring each device sends {ring} bytes (counted), you "
                          f"returned {shown(got_ring, ring, 6)[0]}")
    expect(len(seen) > 1, "bytes_sent returned the same pair for every input")


# ---- data_parallel: a parameter server sharded over the devices -------------------------------
@check("sharded_server_step", simulated=True, changes_inputs=True, observes=[
    "on CPU tensors: afterwards every replica (the same tensor objects, the same storage) holds "
    "the SGD step on the sum of all devices' gradients, equal and uneven chunks",
    "on k simulated GPUs: every replica pulled parameters (not only gradients) from every "
    "other device, the server of its chunk, into its own tensor (the pulled copy is an "
    "ancestor of the replica's final values), and no device, the host CPU included, added up or "
    "computed more than its own chunk's share (tensor_split's chunk j; every operation "
    "counted; a case of 3 devices with a remainder of 2 in every call), and none received more "
    "than its chunk of every other gradient and the other servers' chunks (whole tensors moved "
    "and sliced where they arrive)"])
def check_sharded_server_step(fn):
    """fn(params, grads, devices, lr): params[i], grads[i] flat tensors on devices[i]. Device j
    serves chunk j (tensor_split): it sums chunk j of every gradient, updates chunk j of its
    parameters by SGD (p -= lr * sum) and every device pulls the chunk from it, in place."""
    g = fresh_generator()
    for case, count in enumerate((randint(g, 2, 5), randint(g, 2, 5), 3, randint(g, 4, 5))):
        # the first size divides by the count (equal chunks), the others do not; the last,
        # 2 * count + 1, is one where torch.chunk makes fewer than count chunks
        n = count * randint(g, 2, 6) + (randint(g, 1, count - 1) if case else 0)
        n = 2 * count + 1 if case == 3 else n - n % 3 + 2 if case == 2 else n   # 3 devices, r 2
        start = torch.randn(n, generator=g)
        grads = [torch.randn(n, generator=g) for _ in range(count)]
        lr = randint(g, 1, 9) / 10
        params = [start.clone() for _ in range(count)]
        objects, ptrs = list(params), [p.data_ptr() for p in params]
        what = f"for {count} devices and {n} parameters"
        fn(params, [x.clone() for x in grads], [CPU] * count, lr)
        want = start - lr * torch.stack(grads).sum(0)
        expect(len(params) == count, f"{what}: the list of replicas now has {len(params)} "
               "items; update each replica's tensor in place, leave the list as it is")
        for i, (p, orig) in enumerate(zip(params, objects, strict=True)):
            expect(p is orig and p.data_ptr() == ptrs[i], f"{what}: replica {i} was not "
                   "updated in place (the list holds a new tensor, or its storage was replaced);"
                   " pull the chunks into the replica's own tensor with copy_()")
        for i, p in enumerate(objects):
            if tensor_close(p, want, rtol=1e-5, atol=1e-5):
                continue
            hint = ""
            if tensor_close(p, start, atol=1e-6):
                hint = ": it is unchanged; every device pulls every updated chunk"
            elif tensor_close(p, start - lr * grads[i], rtol=1e-5, atol=1e-5):
                hint = ": it took a step with its own gradient only"
            expect(False, f"{what}: replica {i} differs from the step on the summed gradient "
                          f"(p - lr * sum of the gradients){hint}")
        _served(what, fn, start, grads, lr)


def _served(what, fn, start, grads, lr):
    """Device j sums chunk j (its additions stay within one chunk's), and every replica pulls the
    updated parameters from every server: transfers read the servers' parameters, not only
    gradients."""
    count, n = len(grads), start.numel()
    gpus = FakeGPUs(count)
    params = [gpus.tensor(start, i) for i in range(count)]
    fgrads = [gpus.tensor(x, i) for i, x in enumerate(grads)]
    keys = [p.untyped_storage()._cdata for p in params]
    _, rec = gpus.run(fn, params, fgrads, gpus.devices, lr, what=what)
    chunk = -(-n // count)
    for i in range(len(gpus.devices)):
        pulled = set()          # a pull counts only if what it copied reaches replica i
        for op in rec.transfers(rec.ancestors(params[i])):
            pulled.add(op.reads[-1 if op.name == "copy_" else 0].key)
        missing = [j for j in range(count) if j != i and keys[j] not in pulled]
        expect(not missing, f"{what}: replica {i} never pulled parameters from device(s) "
               f"{', '.join(map(str, missing))}: the update is the server's, not every "
               "device's; device j updates chunk j of its parameters, and every replica copies "
               "that chunk from device j")
    adds, work, most = rec.adds_by_device(), rec.work_by_device(), 3 * (count + 1) * chunk + count
    sizes = dict(zip(gpus.devices, map(len, torch.arange(n).tensor_split(count)), strict=True))
    for d in rec.working_devices(gpus.devices):      # the host (the CPU) included
        # its own chunk: k - 1 additions of gradients and the step's (sum()'s `0 + g` is free)
        a, bound = adds.get(d, 0), count * sizes.get(d, chunk)
        expect(a <= bound, f"{what}: {describe_device(d)} added up {a} elements (per device: "
               f"{[adds.get(x, 0) for x in gpus.devices]}), more than serving its chunk needs "
               f"(at most about {bound}): device j sums and updates chunk j only, tensor_split's "
               "chunk j (the first n % k chunks one element longer)")
        w = work.get(d, 0)
        expect(w <= most, f"{what}: {describe_device(d)} computed {w} elements of work (every "
               f"operation counted; per device: {[work.get(x, 0) for x in gpus.devices]}), more "
               f"than serving its chunk needs (at most about {most}): device j sums and updates "
               "chunk j only")
    got = collections.Counter()
    for _, dst, size, _ in moves(rec):
        got[dst] += size
    for d, size in sorted(got.items(), key=lambda x: -x[1]):
        own = sizes.get(d, chunk)       # chunk j of every other gradient, the others' chunks
        bound = (count - 1) * own + n - own + 2 * count + 8
        expect(size <= bound, f"{what}: {describe_device(d)} received {size} elements, more "
               f"than its part of the step needs (about {bound - 2 * count - 8}: chunk j of every "
               "other gradient, then every other server's chunk of the parameters): move only "
               "the chunks, not whole tensors sliced where they arrive")


# ---- data_parallel: gradient accumulation ----------------------------------------------------
class _RecordingNet:
    """net(X, params), a linear layer. It holds only a closure: what it records is
    `_recording_net`'s, kept by the check, out of the answer's reach."""

    __slots__ = ("_call",)

    def __init__(self, call):
        self._call = call

    def __call__(self, X, params):
        return self._call(X, params)


def _recording_net(taps=None):
    """(net, sizes, passes): a net that records the examples of each call in `sizes`, and each
    call and each backward through what a call returned, in order, in `passes`; with `taps`
    (recorded.Taps), the gradient each backward delivers to its outputs."""
    sizes, passes = [], []

    def call(X, params):
        W, b = params
        sizes.append(X.shape[0])
        passes.append("forward")
        out = X @ W + b
        if out.requires_grad:
            out.register_hook(lambda grad: passes.append("backward"))
            if taps is not None:
                taps.tap(out)
        return out
    return _RecordingNet(call), sizes, passes


@check("accumulated_step", changes_inputs=True, observes=[
    "the examples the check's net saw in each call (one call per micro-batch, none with the "
    "whole batch), and the backward through each call's output, right after it",
    "the parameters afterwards (the same tensors), against one SGD step on the mean loss of "
    "the whole batch; micro-batches of unequal size included; their .grad cleared (None or "
    "zeros) after the call, or else a case whose parameters come in with a stale .grad still "
    "steps right (the answer clears before its backwards)",
    "the dataflow of the step: the parameters afterwards are computed from the gradients the "
    "backwards through the net's outputs delivered (not from a gradient computed beside it)"])
def check_accumulated_step(fn):
    """fn(net, params, X, y, num_micro, lr): forward and backward one micro-batch at a time
    (tensor_split), the gradients of the summed losses adding up in .grad, then one SGD step
    with the gradient of the whole batch's mean loss (divide by n once), and the gradients
    cleared."""
    g, left = fresh_generator(), False
    for case in range(5):
        # case 0, forced: a remainder below num_micro - 1, where torch.chunk's sizes are not
        # tensor_split's (chunks of ceil(n / num_micro), the last one short); case 4, only for
        # an answer that leaves .grad filled: parameters come in with a stale .grad, which an
        # answer that clears before its backwards drops
        if case == 4 and not left:
            break
        num_micro = randint(g, 3 if case == 0 else 2, 5)
        n = num_micro * randint(g, 2, 4) + randint(g, 1, num_micro - (2 if case == 0 else 1))
        d, c = randint(g, 3, 6), randint(g, 2, 4)
        X, y = torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)
        start = [torch.randn(d, c, generator=g), torch.randn(c, generator=g)]
        lr = randint(g, 1, 9) / 10
        params = [p.clone().requires_grad_() for p in start]
        for p in params if case == 4 else ():
            p.grad = torch.randn(p.shape, generator=g)
        objects = list(params)
        with Recorder() as rec:
            taps = Taps(rec)
            net, sizes, passes = _recording_net(taps)
            call = f"accumulated_step(net, params, X of {n} examples, y, {num_micro}, {lr})"
            copies = kept(X, y, *start)
            fn(net, params, X, y, num_micro, lr)
        made = taps.made(params)
        expect_unchanged(call, copies, [X, y, *start], ["X", "y", "W", "b"])
        ref = [p.clone().requires_grad_() for p in start]
        grads = torch.autograd.grad(loss(X @ ref[0] + ref[1], y).mean(), ref)
        want = [(p - lr * gr).detach() for p, gr in zip(start, grads, strict=True)]
        micro = [len(s) for s in torch.arange(n).tensor_split(num_micro)]
        expect(n not in sizes, f"{call}: the net saw all {n} examples in one call "
               f"(calls: {sizes}); run one micro-batch at a time ({micro})")
        chunks = [len(s) for s in torch.arange(n).chunk(num_micro)]
        expect(sorted(sizes) != sorted(chunks) or chunks == micro,
               f"{call}: the net saw micro-batches of {sizes} examples, torch.chunk's sizes "
               f"(chunks of ceil(n / num_micro), the last one short, {len(chunks)} of them); "
               f"the exercise splits with tensor_split, which makes {micro}: num_micro "
               "micro-batches whose sizes differ by one at most")
        expect(sorted(sizes) == sorted(micro), f"{call}: the net saw micro-batches of "
               f"{sizes} examples; tensor_split makes {micro}")
        expect(passes == ["forward", "backward"] * (len(passes) // 2),
               f"{call}: the net's calls and the backwards through what they returned ran in "
               f"the order {passes}: backward through each micro-batch's output right after "
               "its forward (one graph of every micro-batch keeps them all alive; a gradient "
               "computed another way does not flow through the net's calls)")
        expect(made, f"{call}: the step does not use the gradients the "
               "backwards through the net's calls made (a gradient computed beside the net, "
               "the net's backwards only decoys): step with what they accumulated in .grad")
        expect(len(params) == 2, f"{call}: params now has {len(params)} items; update W and b "
                                 "in place, leave the list as it is")
        for name, p, w, orig in zip(("W", "b"), params, want, objects, strict=True):
            expect(p is orig, f"{call}: params[{'W b'.split().index(name)}] was replaced by a "
                              "new tensor; update the parameters in place")
            if tensor_close(p.detach(), w, rtol=1e-5, atol=1e-6):
                continue
            last = [q.clone().requires_grad_() for q in start]
            Xl, yl = X.tensor_split(num_micro)[-1], y.tensor_split(num_micro)[-1]
            gl = torch.autograd.grad(loss(Xl @ last[0] + last[1], yl).sum() / n, last)
            hint = ""
            if case == 4:
                hint = (": the parameters came in with a stale .grad (an earlier step's) and "
                        "the answer leaves its gradients in .grad: clear the gradients before "
                        "the backwards (zero_grad first) or after the step")
            elif all(tensor_close(q.detach(), s - lr * x, atol=1e-6)
                   for q, s, x in zip(params, start, gl, strict=True)):
                hint = ": only the last micro-batch's gradient was used; .grad adds up over " \
                       "backward calls, so do not zero it between micro-batches"
            else:
                hint = (": sum each micro-batch's per-example losses and divide by the whole "
                        f"batch's {n} once (averaging the micro-batches' means weighs "
                        "unequal micro-batches wrongly)")
            expect(False, f"{call}: {name} differs from one SGD step on the whole batch's mean "
                          f"loss{hint}")
        # the text: "and clear": before the backwards (then case 4 proves it) or after the step
        left = left or any(p.grad is not None and p.grad.any() for p in params)
