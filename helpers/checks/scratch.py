"""Checks for the exercises of Part II (data parallelism from scratch).

Every check runs on plain CPU tensors (several "devices" are all the CPU), so a laptop is enough.
"""
import math

import torch
from torch import nn

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
def check_allreduce_spread(fn):
    """fn(data) sums a list of tensors in place, spreading the work over the devices: afterwards
    every tensor of the list (the same tensor objects, the same storage) holds the sum."""

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

    return run_check("allreduce_spread", body, fn)


# ---------------------------------------------------------------------------------------------
def _random_linear(g, num_inputs, num_outputs):
    """A linear net with random weights drawn from `g` (not from torch's global generator)."""
    net = nn.utils.skip_init(nn.Linear, num_inputs, num_outputs)
    with torch.no_grad():
        net.weight.copy_(torch.randn(num_outputs, num_inputs, generator=g))
        net.bias.copy_(torch.randn(num_outputs, generator=g))
    return net


def check_evaluate_accuracy_multi(fn):
    """fn(net, data_iter, devices) returns the test accuracy of `net` with every batch split over
    `devices`: the same number as the single-device evaluate_accuracy, uneven batches included."""

    def body(fn):
        from ..training import evaluate_accuracy

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
            net = _random_linear(g, num_inputs, num_classes)
            params = [p.detach().clone() for p in net.parameters()]
            data_iter = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                    batch_size=batch_size,
                                                    generator=torch.Generator())
            devices = [CPU] * k
            want = evaluate_accuracy(net, data_iter, CPU)
            what = (f"evaluate_accuracy_multi on {n} examples in batches of {batch_size} (the last "
                    f"has {last}) over {k} devices")
            got = as_number(fn(net, data_iter, devices), what)
            expect(all(torch.equal(p, q) for p, q in zip(net.parameters(), params)),
                   f"{what} changed the net's parameters: evaluation must leave them as they are")
            if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                continue
            with torch.no_grad():
                right = [(net(Xb).argmax(dim=1) == yb) for Xb, yb in data_iter]
            shards = [r.tensor_split(k) for r in right]
            correct = sum(int(r.sum()) for r in right)
            expect(got != correct, f"{what} returned {got:g}, the number of correct predictions; "
                                   f"expected the fraction {want:.4f} (divide by the {n} examples)")
            first = sum(int(s[0].sum()) for s in shards)
            first_n = sum(len(s[0]) for s in shards)
            expect(not (math.isclose(got, first / first_n) or math.isclose(got, first / n)),
                   f"{what} returned {got:.4f}, expected {want:.4f}: it counts only the first "
                   "device's shard of each batch; add up the correct predictions of every shard")
            per_batch = sum(float(r.float().mean()) for r in right) / len(right)
            expect(not math.isclose(got, per_batch),
                   f"{what} returned {got:.4f}, the mean of the per-batch accuracies; expected "
                   f"{want:.4f}: with a short last batch, count correct predictions and examples "
                   "over all batches, then divide")
            per_shard = [float(p.float().mean()) for s in shards for p in s]
            expect(not math.isclose(got, sum(per_shard) / len(per_shard)),
                   f"{what} returned {got:.4f}, the mean of the per-shard accuracies; expected "
                   f"{want:.4f}: shards differ in size, so count correct predictions and examples, "
                   "then divide")
            expect(False, f"{what} returned {got:.4f}, expected {want:.4f} (the single-device "
                          "accuracy)")

    return run_check("evaluate_accuracy_multi", body, fn)
