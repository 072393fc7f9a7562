"""Shortcut answers that read tensor memory at its address, `data_ptr()`, without ctypes fail
(tests/check_cases.py's form): numpy's `__array_interface__` over the address, or
`torch._C._construct_storage_from_data_pointer`; an address taken before the values were
written too (addresses.py: the storage is exposed from then on). Right answers that compare
addresses, as FSDP's views do, pass."""
from fractions import Fraction

import torch
from check_cases import other, parametrize_cases, posted_then, raw_floats, shortcut, storage_at

from helpers.checks._core import fresh

FOREIGN = "read out of its own tensors"
MADE = "makes memory from an integer address"
_POSTED = {}


def _posted_then(grads, comm, post, read):
    """check_cases.posted_then with `post(g)` an address: read at (address, numel)."""
    posted_then(grads, comm, lambda g: (post(g), g.numel()), lambda kept, g: read(*kept, g))


def _copy_address(g):
    keep = g.clone()
    _POSTED.setdefault("keep", []).append(keep)     # alive until the others read it
    return keep.data_ptr()


def _address_then_written(g):
    keep = torch.zeros_like(g)
    ptr = keep.data_ptr()                   # taken while it held zeros
    keep.copy_(g)
    _POSTED.setdefault("keep", []).append(keep)
    return ptr


def _by_interface(ptr, n, g):
    return torch.from_numpy(raw_floats(ptr, n)).view(g.shape)


def _by_storage(ptr, n, g):
    return torch.empty(0).set_(storage_at(ptr, g.device, n * 4)).view(g.shape).clone()


@shortcut("check_dp_average", "another rank's gradient read at its data_ptr() by numpy", FOREIGN)
def dp_average_array_interface(grads, comm):
    _posted_then(grads, comm, _copy_address, _by_interface)


@shortcut("check_dp_average", "an address taken before the gradient was copied there", FOREIGN)
def dp_average_address_before_values(grads, comm):
    _posted_then(grads, comm, _address_then_written, _by_interface)


@shortcut("check_dp_average", "a storage made from another rank's data_ptr()", MADE)
def dp_average_storage_from_address(grads, comm):
    _posted_then(grads, comm, _copy_address, _by_storage)


@shortcut("check_dp_average", "the maker named plainly", "_construct_storage_from_data_pointer")
def dp_average_named_maker(grads, comm):
    make = torch._C._construct_storage_from_data_pointer
    _posted_then(grads, comm, _copy_address, lambda ptr, n, g: torch.empty(0).set_(
        make(ptr, g.device, n * 4)).view(g.shape).clone())


class _Raw:
    def __init__(self, ptr, n):
        self.__array_interface__ = {"data": (ptr, True), "shape": (n,), "typestr": "<f4",
                                    "version": 3}


@shortcut("check_dp_average", "numpy's protocol named plainly", "__array_interface__")
def dp_average_named_interface(grads, comm):
    import numpy as np
    _posted_then(grads, comm, _copy_address, lambda ptr, n, g: torch.from_numpy(
        np.asarray(_Raw(ptr, n)).copy()).view(g.shape))


def _combined(counts, means, variances, floats):
    """E[x^2] - E[x]^2 in exact fractions from the values `floats(t)` reads (the refused
    formula, exact enough to pass but for how it read them)."""
    w, c = means.shape
    m, v, n_r = ([Fraction(x) for x in floats(t)] for t in (means, variances, counts))
    n = sum(n_r)
    mean = [sum(n_r[r] * m[r * c + j] for r in range(w)) / n for j in range(c)]
    ex2 = [sum(n_r[r] * (v[r * c + j] + m[r * c + j] ** 2) for r in range(w)) / n
           for j in range(c)]
    return (torch.tensor([float(x) for x in mean]),
            torch.tensor([float(x - y ** 2) for x, y in zip(ex2, mean, strict=True)]))


def _at_address(t):
    t = t.contiguous()
    return raw_floats(t.data_ptr(), t.numel()).astype(float).tolist()


def _written_after(t):
    buf = torch.zeros(t.numel())
    ptr = buf.data_ptr()                    # the address of zeros
    buf.copy_(t.reshape(-1))
    return raw_floats(ptr, t.numel()).astype(float).tolist()


def _storage_floats(t):
    t = t.contiguous()
    over = torch.empty(0).set_(storage_at(t.data_ptr(), t.device, t.numel() * 4))
    return over.clone().numpy().astype(float).tolist()


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 from values read at their address",
          "data_ptr()")
def global_mean_var_at_address(counts, means, variances):
    return _combined(counts, means, variances, _at_address)


@shortcut("check_global_mean_var", "read at an address taken before the copy", "data_ptr()")
def global_mean_var_address_before_copy(counts, means, variances):
    return _combined(counts, means, variances, _written_after)


@shortcut("check_global_mean_var", "a storage made from an address", MADE)
def global_mean_var_storage_from_address(counts, means, variances):
    return _combined(counts, means, variances, _storage_floats)


@other("check_dp_average", "views and buffers told apart by data_ptr()")
def dp_average_compares_addresses(grads, comm):
    flat = torch.cat([g.reshape(-1) for g in grads])
    views = flat.split([g.numel() for g in grads])
    assert all(v.data_ptr() >= flat.data_ptr() for v in views)
    assert views[0].data_ptr() == flat.untyped_storage().data_ptr()
    comm.all_reduce(flat)
    flat /= comm.world
    for g, v in zip(grads, views, strict=True):
        assert g.data_ptr() != v.data_ptr()          # a copy, not a view of the buffer
        g.copy_(v.view(g.shape))


@other("check_shard_flat", "a shard checked to own its memory by data_ptr()")
def shard_flat_own_memory(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
    shard = flat.chunk(world)[rank]
    start = shard.data_ptr() - flat.data_ptr()
    assert start == rank * shard.numel() * shard.element_size()
    out = shard.clone()
    assert out.data_ptr() != shard.data_ptr()
    return out


def test_regrade_refuses_address_routes():
    """fresh.regrade's fresh import watches the addresses too."""
    try:
        fresh.regrade("check_dp_average", dp_average_array_interface)
    except AssertionError as e:
        assert FOREIGN in str(e), e
    else:
        raise AssertionError("an address route passed fresh.regrade")


test_case = parametrize_cases(__name__)
