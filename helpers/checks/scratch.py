"""Checks for the exercises of Part II (data parallelism from scratch).

Every check runs on plain CPU tensors (several "devices" are all the CPU), so a laptop is enough.
"""
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._core import CheckFailed, as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_shard_sizes", "check_allreduce_spread", "check_evaluate_accuracy_multi"]

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
def _as_sizes(value, call):
    """The student's sizes as a list of ints, or fail saying what came back."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        sizes = list(value)
    except TypeError:
        raise CheckFailed(f"{call} returned {value!r}, expected a list of shard sizes")
    for s in sizes:
        if isinstance(s, torch.Tensor) and s.numel() == 1:
            s = s.item()
        expect(not isinstance(s, bool) and isinstance(s, (int, float)) and float(s).is_integer(),
               f"{call} returned {sizes!r}: every shard size must be a whole number of rows")
    return [int(s) for s in sizes]


def _rows(m):
    return f"{m} row" if m == 1 else f"{m} rows"


def check_shard_sizes(fn):
    """fn(n, k) returns the sizes of the k shards of n examples, in the order torch.tensor_split
    uses (the larger shards first, sizes differing by at most one); n < k raises ValueError."""

    def body(fn):
        g = fresh_generator()
        cases = [(randint(g, k, 60), k) for k in (randint(g, 2, 8) for _ in range(5))]
        k = randint(g, 3, 8)
        cases.append((k * randint(g, 1, 6) + randint(g, 1, k - 1), k))   # surely uneven
        k = randint(g, 2, 8)
        cases += [(k * randint(g, 1, 6), k), (k, k)]                       # even, one row each
        for n, k in cases:
            call = f"shard_sizes({n}, {k})"
            want = [len(s) for s in torch.arange(n).tensor_split(k)]
            got = _as_sizes(fn(n, k), call)
            expect(len(got) == k,
                   f"{call} returned {len(got)} sizes, expected {k} (one per device)")
            for i, (a, b) in enumerate(zip(got, want)):
                if a == b:
                    continue
                if sorted(got) == sorted(want):
                    hint = ": torch.tensor_split puts the larger shards first"
                elif sum(got) != n:
                    hint = f" (your sizes {got} sum to {sum(got)}, not {n})"
                elif max(got) - min(got) > 1:
                    hint = f" (your sizes {got} differ by more than one)"
                else:
                    hint = ""
                expect(False, f"{call}: shard {i} has {_rows(a)}, expected {b}{hint}")
        k = randint(g, 2, 8)
        n = randint(g, 1, k - 1)
        call = f"shard_sizes({n}, {k})"
        try:
            got = fn(n, k)
        except ValueError:
            pass
        except NotImplementedError:
            raise
        except Exception as e:
            expect(False, f"{call} raised {type(e).__name__}: {e}; fewer examples than devices "
                          "should raise ValueError")
        else:
            expect(False, f"{call} returned {got!r}; with fewer examples ({n}) than devices ({k}) "
                          "some device gets nothing: raise ValueError")

    return run_check("shard_sizes", body, fn)


# ---------------------------------------------------------------------------------------------
_ADDS = {"add", "add_", "sum", "addcmul", "addcmul_", "sub", "sub_"}


class _AddLog(TorchDispatchMode):
    """Counts, per simulated device, the elements that device adds while the mode is active.

    Every check tensor stands for one device; its storage says which. An in-place addition counts
    for the device whose storage it writes into (`owner.add_(other)`), a new tensor belongs to the
    device of its first input (so `a.clone()` stays on a's device, and adds into it count there).
    On one CPU `.to(device)` moves nothing, so this is how the check sees where the work ran.
    """

    def __init__(self, tensors):
        super().__init__()
        self.where = {t.untyped_storage().data_ptr(): i for i, t in enumerate(tensors)}
        self.added = [0] * len(tensors)

    def _device_of(self, t):
        return self.where.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) \
            else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        for a in args:
            if isinstance(a, (list, tuple)):
                inputs += [t for t in a if isinstance(t, torch.Tensor)]
        dev = next((d for d in map(self._device_of, inputs) if d is not None), None)
        if dev is None:
            return out
        name = func.__name__.split(".")[0]
        if name in _ADDS and inputs:
            first = inputs[0]
            n = first.numel() - (out.numel() if name == "sum" else 0)
            self.added[dev] += n if name == "sum" else out.numel()
        results = out if isinstance(out, (list, tuple)) else [out]
        for r in results:
            if isinstance(r, torch.Tensor):
                self.where.setdefault(r.untyped_storage().data_ptr(), dev)
        return out


def check_allreduce_spread(fn):
    """fn(data) sums a list of tensors in place, spreading the additions over the devices: device
    i sums chunk i (a reduce-scatter), then sends it to all (an all-gather). Afterwards every
    tensor of the list (the same tensor objects, the same storage) holds the sum.

    The tensors stand for k devices, and the check counts the additions each device does
    (`_AddLog`): funnelling everything through device 0 (Part II's `allreduce`) or letting every
    device add up the whole tensors gives the right values but fails."""

    def body(fn):
        g = fresh_generator()
        counts = [randint(g, 2, 6) for _ in range(3)] + [randint(g, 3, 6), 1]
        for trial, count in enumerate(counts):
            # sizes that do not divide evenly by the number of tensors
            rows = count * randint(g, 1, 5) + (randint(g, 1, count - 1) if count > 1 else 0)
            shape = (rows,) if trial % 2 == 0 else (rows, randint(g, 2, 4))
            # whole numbers: the sum is exact in any order
            data = [torch.randint(-9, 10, shape, generator=g).float() for _ in range(count)]
            before = [t.clone() for t in data]
            want = torch.stack(before).sum(dim=0)
            tensors, ptrs = list(data), [t.data_ptr() for t in data]
            log = _AddLog(data)
            with log:
                fn(data)
            what = f"for {count} tensor{'s' if count > 1 else ''} of shape {tuple(shape)}"
            expect(isinstance(data, list) and len(data) == count,
                   f"{what}: the list now has {len(data)} items; allreduce must keep the list "
                   "as it is and change the tensors' values")
            for i, (t, orig) in enumerate(zip(data, tensors)):
                stale = "its old values" if torch.equal(orig, before[i]) else "other values"
                expect(t is orig, f"tensor {i} was not updated in place: the list now holds a "
                                  "new tensor, and the original (a replica's .grad) still holds "
                                  f"{stale}; write into it with copy_() or add_() instead of "
                                  "assigning data[i]")
                expect(orig.data_ptr() == ptrs[i],
                       f"tensor {i} was not updated in place: its storage was replaced "
                       "(.data = ... or set_()); write into the existing storage with copy_() "
                       "or add_()")
            bounds = torch.arange(math.prod(shape)).tensor_split(count)
            for i, t in enumerate(tensors):
                if torch.equal(t, want):
                    continue
                expect(not torch.equal(t, before[i]), f"{what}: tensor {i} is unchanged; every "
                                                      "tensor must end up holding the sum")
                flat_t, flat_want = t.reshape(-1), want.reshape(-1)
                wrong = (flat_t != flat_want).nonzero().flatten()
                j = int(wrong[0])
                chunk = next(c for c, b in enumerate(bounds) if j in b)
                even = flat_t.numel() // count * count
                tail = (f"; only the last {flat_t.numel() - even} elements are wrong: the "
                        f"size {flat_t.numel()} does not divide by {count}, so the chunks "
                        "differ in size (torch.tensor_split)") if int(wrong.min()) >= even else ""
                expect(False, f"{what}: tensor {i} holds wrong values: element {j} (in chunk "
                              f"{chunk} of {count}) is {flat_t[j].item():g}, expected "
                              f"{flat_want[j].item():g}, the sum over all {count} tensors{tail}")
            if count == 1:
                continue
            n = math.prod(shape)
            need, share = (count - 1) * n, (count - 1) * len(bounds[0])
            total, busiest = sum(log.added), max(range(count), key=log.added.__getitem__)
            expect(log.added[busiest] <= share or log.added[busiest] < total,
                   f"{what}: device {busiest} did all {total} additions; spread them: device i "
                   f"adds the other devices' chunk i into its own chunk i (at most {share} "
                   "additions each), in place, then sends it to the others")
            expect(total <= need, f"{what}: the devices did {total} additions in all, "
                                  f"{total / need:.1f} times the {need} an allreduce needs: "
                                  "each device should add up only its own chunk, then send it")
            expect(log.added[busiest] <= share,
                   f"{what}: device {busiest} did {log.added[busiest]} of the {total} additions "
                   f"(per device: {log.added}); spread them: device i adds the other devices' "
                   f"chunk i into its own chunk i (at most {share} additions each), in place")

    return run_check("allreduce_spread", body, fn)


# ---------------------------------------------------------------------------------------------
def _random_linear_params(g, num_inputs, num_outputs):
    """The parameters [W (in, out), b] of a functional linear net, drawn from `g` (not from
    torch's global generator)."""
    return [torch.randn(num_inputs, num_outputs, generator=g),
            torch.randn(num_outputs, generator=g)]


class _RecordingNet:
    """A functional net `net(X, params)` (a linear layer) that records every call: how many
    examples it saw, and which parameter tensors it used (their storage)."""

    def __init__(self):
        self.calls = []

    def __call__(self, X, params):
        W, b = params
        self.calls.append((X.shape[0], W.untyped_storage().data_ptr()))
        return torch.mm(X, W) + b


def check_evaluate_accuracy_multi(fn):
    """fn(net, params, data_iter, devices) returns the test accuracy of the functional net
    `net(X, params)` with every batch split over `devices`, each device using its own copy of
    `params`: the same number as the single-device evaluation, uneven batches included.

    The net records its calls: evaluating whole batches on one device, or every shard with the
    one original set of parameters, gives the right number but fails."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 2, 4)
            batch_size = randint(g, k + 1, 13)
            batch_size += batch_size % k == 0            # shards of different sizes
            last = randint(g, k, batch_size - 1)          # and a short last batch
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
            net = _RecordingNet()
            with torch.no_grad():
                right = [(net(Xb, params).argmax(dim=1) == yb) for Xb, yb in data_iter]
            want = sum(int(r.sum()) for r in right) / n
            net.calls.clear()
            what = (f"evaluate_accuracy_multi on {n} examples in batches of {batch_size} (the last "
                    f"has {last}) over {k} devices")
            got = as_number(fn(net, params, data_iter, devices), what)
            expect(all(torch.equal(p, q) for p, q in zip(params, saved)),
                   f"{what} changed the parameters: evaluation must leave them as they are")
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
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
                per_shard = [int(p.sum()) / len(p) for s in shards for p in s]
                expect(not math.isclose(got, sum(per_shard) / len(per_shard), rel_tol=1e-6),
                       f"{what} returned {got:.4f}, the mean of the per-shard accuracies; "
                       f"expected {want:.4f}: shards differ in size, so count correct predictions "
                       "and examples, then divide")
                expect(False, f"{what} returned {got:.4f}, expected {want:.4f} (the "
                              "single-device accuracy)")
            sizes = sorted({m for m, _ in net.calls})
            expect(batch_size not in sizes,
                   f"{what}: the net ran on whole batches of {batch_size} examples; split each "
                   f"batch over the {k} devices (split_batch) and run every shard on its device")
            shard_sizes = {len(s) for b in range(n // batch_size)
                           for s in torch.arange(batch_size).tensor_split(k)}
            expect(shard_sizes <= set(sizes),
                   f"{what}: the net saw batches of {sizes} examples, but the shards of a batch "
                   f"of {batch_size} over {k} devices have {sorted(shard_sizes)}: split every "
                   "batch with split_batch")
            original = params[0].untyped_storage().data_ptr()
            used = {ptr for _, ptr in net.calls}
            expect(original not in used,
                   f"{what}: the shards ran with the original parameters; give each device its "
                   "own copy (get_params(params, device)), as training does")
            expect(len(used) >= k,
                   f"{what}: the {k} devices shared {len(used)} set(s) of parameters; give each "
                   "device its own copy (get_params(params, device))")

    return run_check("evaluate_accuracy_multi", body, fn)
