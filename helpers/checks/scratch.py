"""Checks for the exercises of Part II (data parallelism from scratch).

Values are judged on CPU tensors; where the work ran is judged on simulated GPUs (FakeGPUs:
cuda:0..k-1 on any machine), whose Recorder sees every operation, its device and what it added.
"""
import math

import torch

from ._core import (
    CheckFailed,
    FakeGPUs,
    Recorder,
    as_int,
    as_number,
    check,
    describe_device,
    expect,
    fresh_generator,
    near,
    randint,
    rounding_note,
    shown,
    storage_key,
    tensor_equal,
)
from ._core.exits import watch_exits
from ._core.inputs import expect_unchanged, kept
from ._core.numpy_work import expect_list, numpy_work
from ._core.recorded import outside_calls
from ._core.references import split_size_copies

__all__ = ["check_shard_sizes", "check_allreduce_spread", "check_evaluate_accuracy_multi"]

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
def _as_sizes(value, call):
    """The answer's sizes as a list of ints (ints of any type), or fail saying what came back."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        sizes = list(value)
    except TypeError:
        raise CheckFailed(f"{call} returned {value!r}, expected a list of shard sizes") from None
    return [as_int(s, call) for s in sizes]


def _names(calls):
    """The numpy functions an answer ran, each once, in the order it first ran them."""
    return ", ".join(dict.fromkeys(calls))


def _rows(m):
    return f"{m} row" if m == 1 else f"{m} rows"


@check("shard_sizes", references=["split_batch", *split_size_copies()], observes=[
    "the sizes returned for fresh (n, k), uneven, even, n < k and n over 10**6 (beyond any "
    "table built ahead), against the shards "
    "split_batch makes (torch.tensor_split: larger first, empty shards when n < k)",
    "every torch operation the answer runs, and every numpy function it runs on arrays: the "
    "sizes must come from arithmetic, not from splitting a tensor (or a numpy array) and "
    "measuring it"])
def check_shard_sizes(fn):
    """fn(n, k) returns the sizes of the k shards split_batch makes of n examples: larger shards
    first, sizes differing by at most one; when n < k the last k - n shards are empty (0)."""
    g = fresh_generator()
    cases = [(randint(g, k, 60), k) for k in (randint(g, 2, 8) for _ in range(4))]
    k = randint(g, 3, 8)
    cases.append((k * randint(g, 1, 6) + randint(g, 1, k - 1), k))   # surely uneven
    k = randint(g, 2, 8)
    cases += [(k * randint(g, 1, 6), k), (k, k)]                       # even, one row each
    k = randint(g, 3, 8)
    cases += [(randint(g, 1, k - 1), k), (0, randint(g, 1, 4))]        # fewer rows than devices
    # beyond any table built ahead (each entry a tensor of n rows), within reach of a loop that
    # deals the rows one at a time
    cases.append((randint(g, 10**6, 2 * 10**6), randint(g, 2, 8)))
    for n, k in cases:
        call = f"shard_sizes({n}, {k})"
        with Recorder() as rec, numpy_work(fn) as arrays:
            try:
                value = fn(n, k)
            except ValueError as e:
                if n < k:
                    raise CheckFailed(f"{call} raised ValueError ({e}); split_batch leaves the "
                                      f"last {k - n} shards empty: return "
                                      f"{[1] * n + [0] * (k - n)}") from None
                raise
        # after the answer ran: tensor_split's sizes (its arithmetic, for n beyond memory)
        want = ([len(s) for s in torch.arange(n).tensor_split(k)] if n <= 10**4
                else [n // k + (i < n % k) for i in range(k)])
        expect_list(value, call, "q, r = divmod(n, k)")
        ops = sorted({op.name for op in rec.ops})
        expect(not ops, f"{call}: your code built and split a tensor ({', '.join(ops)}) to "
                        "measure the shards: work the sizes out with arithmetic (divmod)")
        expect(not arrays, f"{call}: your code computed on numpy arrays ({_names(arrays)}): "
                           "that is the split done outside torch, unseen; work the sizes out "
                           "with arithmetic on the numbers (q, r = divmod(n, k))")
        got = _as_sizes(value, call)
        expect(len(got) == k, f"{call} returned {len(got)} sizes, expected {k} (one per device"
                              + (", empty ones included" if n < k else "") + ")")
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a == b:
                continue
            if sorted(got) == sorted(want):
                hint = ": split_batch (torch.tensor_split) puts the larger shards first"
            elif sum(got) != n:
                hint = f" (your sizes {got} sum to {sum(got)}, not {n})"
            elif max(got) - min(got) > 1:
                hint = f" (your sizes {got} differ by more than one)"
            else:
                hint = ""
            expect(False, f"{call}: shard {i} has {_rows(a)}, expected {b}{hint}")


# ---------------------------------------------------------------------------------------------
@check("allreduce_spread", simulated=True, changes_inputs=True,
       references=["ring_allreduce", "ring_reduce_scatter", "ring_all_gather"], observes=[
    "on CPU tensors: afterwards every tensor of the list (the same objects, the same storage) "
    "holds the sum, for one size that k divides and sizes that it does not",
    "on k simulated GPUs (tensor i on cuda:i): no operation mixed devices, the elements each "
    "device added and computed (any operation, not a list of names) are at most about its "
    "share (its tensor_split chunk summed, or a ring's every other chunk once; a remainder of 2 "
    "on 3 devices or more in every call), and every device's tensor is computed from every "
    "device's data"])
def check_allreduce_spread(fn):
    """fn(data) sums a list of tensors in place, spreading the additions over the devices: device
    i sums chunk i (a reduce-scatter), then sends it to all (an all-gather). Afterwards every
    tensor of the list (the same tensor objects, the same storage) holds the sum."""
    g = fresh_generator()
    counts = [randint(g, 2, 6) for _ in range(3)] + [randint(g, 3, 6), randint(g, 4, 6), 1]
    for trial, count in enumerate(counts):
        # the first size divides by the count (equal chunks), the others do not; the fifth,
        # 2 * count + 1, is one where torch.chunk makes fewer than count chunks; the fourth, a
        # remainder of 2 on 3 devices or more, is one where a remainder given whole to one
        # device differs from tensor_split's chunks
        rows = count * randint(g, 1, 5) + (randint(g, 1, count - 1) if count > 1 and trial else 0)
        rows = 2 * count + 1 if trial == 4 else rows - rows % count + 2 if trial == 3 else rows
        shape = (rows,) if trial % 2 == 0 or trial == 3 else (rows, randint(g, 2, 4))
        data = [torch.randint(-9, 10, shape, generator=g).float() for _ in range(count)]
        before = [t.clone() for t in data]
        tensors, ptrs = list(data), [t.data_ptr() for t in data]
        fn(data)
        want = torch.stack(before).sum(dim=0)
        what = f"for {count} tensor{'s' if count > 1 else ''} of shape {tuple(shape)}"
        expect(isinstance(data, list) and len(data) == count,
               f"{what}: the list now has {len(data)} items; allreduce must keep the list "
               "as it is and change the tensors' values")
        for i, (t, orig) in enumerate(zip(data, tensors, strict=True)):
            stale = "its old values" if tensor_equal(orig, before[i]) else "other values"
            expect(t is orig, f"tensor {i} was not updated in place: the list now holds a new "
                              f"tensor, and the original (a replica's .grad) still holds {stale}; "
                              "write into it with copy_() or add_() instead of assigning data[i]")
            expect(orig.data_ptr() == ptrs[i],
                   f"tensor {i} was not updated in place: its storage was replaced (.data = ... "
                   "or set_()); write into the existing storage with copy_() or add_()")
        _values(what, tensors, before, want, count, shape)
        if count > 1:
            _spread(what, fn, before, shape)


def _values(what, tensors, before, want, count, shape):
    bounds = torch.arange(math.prod(shape)).tensor_split(count)
    for i, t in enumerate(tensors):
        if tensor_equal(t, want):
            continue
        expect(not tensor_equal(t, before[i]), f"{what}: tensor {i} is unchanged; every tensor "
                                              "must end up holding the sum")
        flat_t, flat_want = t.reshape(-1), want.reshape(-1)
        wrong = (flat_t != flat_want).nonzero().flatten()
        j = int(wrong[0])
        chunk = next(c for c, b in enumerate(bounds) if j in b)
        even = flat_t.numel() // count * count
        tail = (f"; only the last {flat_t.numel() - even} elements are wrong: the size "
                f"{flat_t.numel()} does not divide by {count}, so the chunks differ in size "
                "(torch.tensor_split)") if int(wrong.min()) >= even else ""
        expect(False, f"{what}: tensor {i} holds wrong values: element {j} (in chunk {chunk} of "
                      f"{count}) is {flat_t[j].item():g}, expected {flat_want[j].item():g}, the "
                      f"sum over all {count} tensors{tail}")


def _spread(what, fn, before, shape):
    """The same answer on simulated GPUs: who added (and computed) how much, and did the sum
    reach every device."""
    count, n = len(before), math.prod(shape)
    gpus = FakeGPUs(count)
    fakes = [gpus.tensor(t, i) for i, t in enumerate(before)]
    keys = [(f.untyped_storage()._cdata, 0) for f in fakes]
    _, rec = gpus.run(fn, list(fakes), what=what)
    most = (count - 1) * -(-n // count)
    # device i sums tensor_split's chunk i ((count - 1) * its size), or in a ring every chunk but
    # its own once (n - its size)
    shares = {d: max((count - 1) * len(c), n - len(c)) for d, c in zip(
        gpus.devices, torch.arange(n).tensor_split(count), strict=True)}
    adds, work = rec.adds_by_device(), rec.work_by_device()
    total = sum(adds.values())
    per = [adds.get(x, 0) for x in gpus.devices]
    # every device over its share, none elsewhere: spread already, each adds too much
    even = set(adds) <= set(gpus.devices) and all(adds.get(x, 0) > y for x, y in shares.items())
    for d in rec.working_devices(gpus.devices):      # the host (the CPU) included
        a, share = adds.get(d, 0), shares.get(d, most)
        expect(a <= share or not even,
               f"{what}: {describe_device(d)} did {a} additions, {a - share} more than its "
               f"chunk needs ({share}; per device: {per}, already spread): add each other "
               "device's chunk i into chunk i once, and nothing more (no sum of all k chunks "
               "including its own)")
        expect(a <= share, f"{what}: {describe_device(d)} did {a} of the {total} additions "
                           f"(per device: {per}); spread them: "
                           f"device i adds the other devices' chunk i into its own chunk i (at "
                           f"most {share} additions here: chunk i of the flattened tensor, "
                           "t.view(-1).tensor_split(k), not of its rows; the first n % k chunks "
                           "one element longer), in place, then sends it to "
                           "the others (or pass the chunks around a ring)")
        w = work.get(d, 0)
        expect(w <= 2 * most + count, f"{what}: {describe_device(d)} computed {w} elements "
               f"(per device: {[work.get(x, 0) for x in gpus.devices]}), more than its chunk "
               "needs: each device sums only its own chunk")
    expect(total <= (count - 1) * n, f"{what}: the devices did {total} additions in all, more "
                                     f"than the {(count - 1) * n} an allreduce needs")
    for i, f in enumerate(fakes):
        read = {(r.key, r.version) for op in rec.ancestors(f) for r in op.reads}
        missing = [j for j, key in enumerate(keys) if j != i and key not in read]
        expect(not missing, f"{what}: the tensor on {describe_device(gpus.devices[i])} never "
                            f"received the chunks summed from device(s) "
                            f"{', '.join(map(str, missing))}: send every summed chunk to all")


# ---------------------------------------------------------------------------------------------
def _random_linear_params(g, num_inputs, num_outputs):
    """The parameters [W (in, out), b] of a functional linear net, drawn from `g` (not from
    torch's global generator)."""
    return [torch.randn(num_inputs, num_outputs, generator=g),
            torch.randn(num_outputs, generator=g)]


class _RecordingNet:
    """A functional net `net(X, params)` (a linear layer). It holds only a closure: what it
    records is `_recording_net`'s, kept by the check, out of the answer's reach."""

    __slots__ = ("_call",)

    def __init__(self, call):
        self._call = call

    def __call__(self, X, params):
        return self._call(X, params)


def _recording_net(rec=None):
    """(net, calls, spans): a net that records every call in `calls` (how many examples it saw,
    which parameter tensors it used: their storage, the devices) and, with a Recorder `rec`,
    the range of its operations each call ran in `spans`; the answer gets only the net."""
    calls, spans = [], []

    def call(X, params):
        W, b = params
        calls.append((X.shape[0], W.untyped_storage()._cdata, X.device, W.device))
        start = len(rec.ops) if rec is not None else 0
        out = torch.mm(X, W) + b
        if rec is not None:
            spans.append(range(start, len(rec.ops)))
        return out
    return _RecordingNet(call), calls, spans


@check("evaluate_accuracy_multi", simulated=True, observes=[
    "on CPU: the accuracy returned against the one-device evaluation (uneven shards, a short "
    "last batch, once one smaller than the device count: empty shards); the check's net "
    "records the examples and the parameter storage of each call",
    "the dataflow from the parameters: no work on them (or on copies of them) outside the "
    "net's calls, and none read out of torch",
    "on k simulated GPUs: every shard and the parameters it ran with were on the shard's "
    "device, and every device ran shards"])
def check_evaluate_accuracy_multi(fn):
    """fn(net, params, data_iter, devices) returns the test accuracy of the functional net
    `net(X, params)` with every batch split over `devices`, each device using its own copy of
    `params`: the same number as the single-device evaluation, uneven batches included."""
    g = fresh_generator()
    for trial in range(3):
        k = randint(g, 2, 4)
        batch_size = randint(g, k + 1, 13)
        batch_size += batch_size % k == 0            # shards of different sizes
        # and a short last batch; once smaller than k, leaving devices an empty shard
        last = randint(g, 1, k - 1) if trial == 0 else randint(g, k, batch_size - 1)
        n = batch_size * randint(g, 2, 4) + last
        num_inputs, num_classes = randint(g, 3, 8), randint(g, 2, 5)
        X = torch.randn(n, num_inputs, generator=g)
        y = torch.randint(0, num_classes, (n,), generator=g)
        params = _random_linear_params(g, num_inputs, num_classes)
        saved = [p.clone() for p in params]
        data_iter = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                batch_size=batch_size,
                                                generator=torch.Generator())
        devices = [CPU] * k
        rec = Recorder()
        net, calls, spans = _recording_net(rec)
        what = (f"evaluate_accuracy_multi on {n} examples in batches of {batch_size} (the last "
                f"has {last}) over {k} devices")
        copies = kept(X, y)
        exits = []
        with rec, watch_exits(lambda t, how, exits=exits: exits.append((storage_key(t), how))):
            got = fn(net, params, data_iter, devices)
        beside = outside_calls(rec, spans, params, exits)   # the net a decoy?
        expect(not beside, f"{what}: your code computed with the parameters outside the net "
                           f"({beside}): every prediction must come from net(X, params) on a "
                           "shard, with that device's copy of the parameters")
        got, dtype = as_number(got, what, with_dtype=True)
        expect(all(tensor_equal(p, q) for p, q in zip(params, saved, strict=True)),
               f"{what} changed the parameters: evaluation must leave them as they are")
        expect_unchanged(what, copies, [X, y], ["data (X)", "data (y)"])
        with torch.no_grad():           # the expected accuracy, after the answer returned
            right = [(_recording_net()[0](Xb, params).argmax(dim=1) == yb) for Xb, yb in data_iter]
        want = sum(int(r.sum()) for r in right) / n
        if not (near(got, want, dtype, 16, 1e-9) or abs(got - want) <= 1e-12):
            expect(not (math.isnan(got) and last < k), f"{what} returned nan: the last batch "
                   f"leaves {k - last} device(s) an empty shard, whose mean is nan; count "
                   "correct predictions and examples, then divide")
            shards = [r.tensor_split(k) for r in right]
            correct = sum(int(r.sum()) for r in right)
            expect(got != correct, f"{what} returned {got:g}, the number of correct "
                                   f"predictions; expected the fraction {want:.4f} (divide "
                                   f"by the {n} examples)")
            first = sum(int(s[0].sum()) for s in shards)
            first_n = sum(len(s[0]) for s in shards)
            expect(not (math.isclose(got, first / first_n) or math.isclose(got, first / n)),
                   f"{what} returned {got:.4f}, expected {want:.4f}: it counts only the first "
                   "device's shard of each batch; add up the correct predictions of every "
                   "shard")
            per_batch = sum(int(r.sum()) / len(r) for r in right) / len(right)
            expect(not math.isclose(got, per_batch, rel_tol=1e-6),
                   f"{what} returned {got:.4f}, the mean of the per-batch accuracies; "
                   f"expected {want:.4f}: with a short last batch, count correct predictions "
                   "and examples over all batches, then divide")
            per_shard = [int(p.sum()) / len(p) for s in shards for p in s if len(p)]
            expect(not math.isclose(got, sum(per_shard) / len(per_shard), rel_tol=1e-6),
                   f"{what} returned {got:.4f}, the mean of the per-shard accuracies; "
                   f"expected {want:.4f}: shards differ in size, so count correct predictions "
                   "and examples, then divide")
            shown_got, shown_want = shown(got, want)
            expect(False, f"{what} returned {shown_got}, expected {shown_want} (the "
                          f"single-device accuracy){rounding_note(got, want, dtype)}")
        sizes = sorted({c[0] for c in calls})
        expect(batch_size not in sizes,
               f"{what}: the net ran on whole batches of {batch_size} examples; split each "
               f"batch over the {k} devices (split_batch) and run every shard on its device")
        shard_sizes = {len(s) for b in range(n // batch_size)
                       for s in torch.arange(batch_size).tensor_split(k)}
        expect(shard_sizes <= set(sizes),
               f"{what}: the net saw batches of {sizes} examples, but the shards of a batch "
               f"of {batch_size} over {k} devices have {sorted(shard_sizes)}: split every "
               "batch with split_batch")
        original = params[0].untyped_storage()._cdata
        used = {c[1] for c in calls}
        expect(original not in used,
               f"{what}: the shards ran with the original parameters; give each device its "
               "own copy (get_params(params, device)), as training does")
        expect(len(used) >= k,
               f"{what}: the {k} devices shared {len(used)} set(s) of parameters; give each "
               "device its own copy (get_params(params, device))")
        _placed(what, fn, params, data_iter, k)


def _placed(what, fn, params, data_iter, k):
    """The same evaluation on simulated GPUs: where each shard and its parameters were."""
    gpus = FakeGPUs(k)
    net, calls, _ = _recording_net()
    gpus.run(fn, net, params, data_iter, gpus.devices, what=what)
    ran = {}
    for rows, _, x_dev, w_dev in calls:
        expect(x_dev == w_dev, f"{what}: a shard of {rows} examples on {describe_device(x_dev)} "
                               f"ran with parameters on {describe_device(w_dev)}")
        ran[x_dev] = ran.get(x_dev, 0) + rows
    for d in gpus.devices:
        expect(ran.get(d, 0) > 0, f"{what}: {describe_device(d)} evaluated nothing (devices "
                                  f"that ran shards: {sorted(map(describe_device, ran))}): move "
                                  "each shard and a copy of the parameters to its device")
