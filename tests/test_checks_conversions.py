"""Shortcut answers whose work happens where the check used to look away (tests/check_cases.py's
form): in an object of the answer's own class that computes when the check converts or compares
it (after the guarded call: references back, guard off, Recorder stopped; settle.py), in a write
through a numpy view of a tensor every rank shares (provenance.py, rank_arrays.read_only), and in
numpy reached through an object's attribute or a method of an array (numpy_work.py). Each must
fail; right answers (a namedtuple, a generator of sizes by arithmetic, a shared constant read
through numpy) pass."""
import collections
import sys
import threading
import types

import numpy as np
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

import helpers

OWN = "of your own class"
PEEK = "inspects the running program"
VIEW = "through a numpy view"
NUMPY = ["numpy arrays", "with arithmetic"]


# ---- 1. objects that compute when the check converts them ------------------------------------
class _SplitWhenListed:
    """Shard sizes measured on a tensor split, but only when the check lists them."""

    def __init__(self, n, k):
        self.n, self.k = n, k

    def __iter__(self):
        return iter([len(s) for s in torch.arange(self.n).tensor_split(self.k)])


@shortcut("check_shard_sizes", "__iter__ splits a tensor when the check lists it", OWN)
def shard_sizes_split_when_listed(n, k):
    return _SplitWhenListed(n, k)


@shortcut("check_shard_sizes", "a generator that splits a tensor as the check runs it",
          "built and split a tensor")
def shard_sizes_lazy_split(n, k):
    def sizes():
        yield from (len(s) for s in torch.arange(n).tensor_split(k))
    return sizes()


class _BytesLater(int):
    """A number whose float() asks the course's held_bytes, once the reference is back."""

    def __float__(self):
        return float(getattr(helpers, "held_" + "bytes")(self.tensors))


@shortcut("check_tensor_bytes", "__float__ calls the course's held_bytes after the call", OWN)
def tensor_bytes_float_later(tensors):
    out = _BytesLater(0)
    out.tensors = tensors
    return out


class _Peeking:
    """A group whose __iter__ walks to the check's frame and yields its expected value."""

    def __init__(self, key):
        self.key = key

    def __iter__(self):
        f = getattr(sys, "_get" + "frame")(1)
        while f is not None:                    # names computed: the static scan sees none
            want = getattr(f, "f_" + "locals").get("want")
            if isinstance(want, dict) and self.key in want:
                return iter(want[self.key])
            f = getattr(f, "f_" + "back")
        return iter(())


@shortcut("check_mesh_groups", "__iter__ reads `want` in the check's frame when converted", OWN)
def mesh_groups_peeking(rank, dp, tp):
    return dict(coords=_Peeking("coords"), tp_group=_Peeking("tp_group"),
                dp_group=_Peeking("dp_group"))


@shortcut("check_overlap_hooks", "finish() reads the running program's frames", PEEK)
def overlap_hooks_finish_peeks(model):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: handles.append(dist.all_reduce(p.grad, async_op=True)))

    def finish():
        getattr(getattr(sys, "_get" + "frame")(1), "f_" + "locals")     # the check's frame
        for h in handles:
            h.wait()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


_Stats = collections.namedtuple("_Stats", "mean var")


@other("check_global_mean_var", "a namedtuple (mean, var)")
def global_mean_var_namedtuple(counts, means, variances):
    w = (counts / counts.sum())[:, None]
    mean = (w * means).sum(0)
    return _Stats(mean, (w * (variances + (means - mean) ** 2)).sum(0))


@other("check_shard_sizes", "arithmetic in a thread it starts and never joins")
def shard_sizes_thread_not_joined(n, k):
    out = [0] * k

    def work():     # starts as the call returns: its profile install races the check's
        q, r = divmod(n, k)
        out[:] = [q + (i < r) for i in range(k)]
    threading.Thread(target=work).start()
    return out


@other("check_shard_sizes", "a generator of sizes from divmod")
def shard_sizes_generator(n, k):
    q, r = divmod(n, k)
    return (q + 1 if i < r else q for i in range(k))


# ---- 2. writes through a numpy view of a tensor every rank shares -------------------------------
_ROWS = torch.zeros(3, 64, dtype=torch.float64)     # made before the run: every rank sees it


def _average_rows(grads, comm, view, put):
    """Each rank takes a numpy view of _ROWS (`view()`), waits for the others, writes twice its
    gradients into its row (`put`: doubled in numpy, so no value is one a rank read out of
    torch), reads every row in torch and halves the mean, then zeroes its row."""
    k, r = comm.world, comm.rank
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    rows = view()
    comm.all_reduce(torch.zeros(1))          # a decoy that doubles as a barrier
    put(rows[r, :flat.numel()], flat.numpy() * 2)
    comm.all_reduce(torch.zeros(1))
    mean = (_ROWS[:k, :flat.numel()].mean(0) / 2).float()
    comm.all_reduce(torch.zeros(1))
    put(rows[r, :flat.numel()], np.zeros(flat.numel()))    # no values left for the next run
    for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
        g.copy_(m.view_as(g))


def _assign(row, values):
    row[:] = values


@shortcut("check_dp_average", "t.numpy()[...] = into a module-level tensor", VIEW)
def dp_average_numpy_assign(grads, comm):
    _average_rows(grads, comm, _ROWS.numpy, _assign)


@shortcut("check_dp_average", "np.copyto into np.asarray of a module-level tensor", "read-only")
def dp_average_numpy_copyto(grads, comm):
    _average_rows(grads, comm, lambda: np.asarray(_ROWS), np.copyto)


@shortcut("check_dp_average", "np.multiply(..., out=) into a module-level tensor's view",
          "read-only")
def dp_average_numpy_out(grads, comm):
    _average_rows(grads, comm, _ROWS.numpy, lambda row, values: np.multiply(values, 1, out=row))


@shortcut("check_dp_average", "np.from_dlpack of a module-level tensor, written", "through dlpack")
def dp_average_dlpack(grads, comm):
    _average_rows(grads, comm, lambda: np.from_dlpack(_ROWS), _assign)


_ONE = torch.ones(1)                        # a constant every rank reads, made before the run


@other("check_dp_average", "a shared constant read through .numpy()")
def dp_average_constant_numpy(grads, comm):
    for g in grads:
        comm.all_reduce(g)
        g.mul_(float(_ONE.numpy()[0]) / comm.world)


# ---- 3. numpy through an object's attribute, methods of arrays ---------------------------------
_NS = types.SimpleNamespace(index=np.arange(64), ones=np.ones(64, dtype=np.int64))


class _Holder:
    index = np.arange(64)


@shortcut("check_shard_sizes", "a comparison on an array an object's attribute holds", NUMPY)
def shard_sizes_attribute(n, k):
    q, r = divmod(n, k)
    return ((_NS.index[:k] < r) + q).tolist()


@shortcut("check_dp_shard_sizes", "np.minimum on a class attribute's array", NUMPY)
def dp_shard_sizes_class_attribute(batch_size, k):
    size = -(-batch_size // k)
    starts = _Holder.index[:-(-batch_size // size)] * size
    return [int(v) for v in (batch_size - starts).clip(max=size)]


@shortcut("check_shard_sizes", "np.int64(q).repeat(k), then array methods", NUMPY)
def shard_sizes_scalar_repeat(n, k):
    q, r = divmod(n, k)
    sizes = np.int64(q).repeat(k)
    sizes[:r] += 1
    return [int(v) for v in sizes]


@shortcut("check_shard_sizes", "array methods in a thread the answer starts", NUMPY)
def shard_sizes_methods_in_a_thread(n, k):
    out = []

    def work():     # only the profile function sees these (no numpy function is called)
        sizes = np.int64(n // k).repeat(k)
        sizes[:n % k] += 1
        out.extend(int(v) for v in sizes)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out


@shortcut("check_dp_shard_sizes", "ndarray.cumsum, unbound, of an attribute's array", NUMPY)
def dp_shard_sizes_cumsum(batch_size, k):
    size = -(-batch_size // k)
    ends = [min(int(e) * size, batch_size) for e in np.ndarray.cumsum(_NS.ones[:k])]
    return [b - a for a, b in zip([0, *ends], ends) if b > a]


test_case = parametrize_cases(__name__)
