"""Shortcut answers that move tensor memory through a storage object's own methods fail
(tests/check_cases.py's form): a storage the answer holds (built with `torch.UntypedStorage(n)`,
or taken from a tensor before its values were written) reads and writes its memory in C, with no
aten operation (`_write_file`, pickling, `torch.save`; `_set_from_file`, `storage[i] = b`).
storage_exits.py watches those methods as exits and entries. Right answers that use storages as
FSDP and the memory chapters do (free with `resize_(0)`, compare `data_ptr()`) pass."""
import io
import pickle
import struct
from fractions import Fraction

import torch
from check_cases import other, parametrize_cases, posted_then, shortcut

from helpers.checks._core import fresh

FOREIGN = "read out of its own tensors"


def _header(raw):
    """`_set_from_file`'s input: the byte count, then the bytes."""
    return io.BytesIO(struct.pack("<q", len(raw)) + raw)


def _bytes_out(g):
    return g.numpy().tobytes()              # a watched exit: the rank's own values


def _set_from_file(raw, g):
    out = torch.empty_like(g)               # the rank's own storage, written in C
    out.untyped_storage()._set_from_file(_header(raw), None, False, 1)
    return out


def _fresh_storage(raw, g):
    storage = torch.UntypedStorage(len(raw))          # no .untyped_storage() call at all
    out = torch.empty(0, dtype=g.dtype).set_(storage).view(g.shape)
    storage._set_from_file(_header(raw), None, False, 1)
    return out


def _setitem(raw, g):
    out = torch.empty_like(g)
    storage = out.untyped_storage()
    for i, b in enumerate(raw):
        storage[i] = b
    return out


@shortcut("check_dp_average", "other ranks' bytes written in by storage._set_from_file", FOREIGN)
def dp_average_set_from_file(grads, comm):
    posted_then(grads, comm, _bytes_out, _set_from_file)


@shortcut("check_dp_average", "a storage built empty, set on a tensor, then written from a file",
          FOREIGN)
def dp_average_fresh_storage(grads, comm):
    posted_then(grads, comm, _bytes_out, _fresh_storage)


@shortcut("check_dp_average", "other ranks' bytes written in byte by byte (storage[i] = b)",
          FOREIGN)
def dp_average_storage_setitem(grads, comm):
    posted_then(grads, comm, _bytes_out, _setitem)


def _held(g, typed=False):
    """A storage the rank builds and copies its gradient into (an aten copy_), still held."""
    storage = (torch.TypedStorage(g.numel(), dtype=g.dtype) if typed
               else torch.UntypedStorage(g.numel() * g.element_size()))
    torch.empty(0, dtype=g.dtype).set_(storage).copy_(g.reshape(-1))
    return storage


def _write_file(g):
    buf = io.BytesIO()
    _held(g)._write_file(buf, False, False, 1)
    return buf.getvalue()


def _early_handle(g):
    out = torch.zeros_like(g)
    storage = out.untyped_storage()         # taken while the tensor held zeros
    out.copy_(g)
    buf = io.BytesIO()
    storage._write_file(buf, False, False, 1)
    return buf.getvalue()


def _wrapped(raw, g):
    return torch.frombuffer(bytearray(raw), dtype=g.dtype).view(g.shape)


@shortcut("check_dp_average", "gradients written out by storage._write_file", FOREIGN)
def dp_average_write_file(grads, comm):
    posted_then(grads, comm, _write_file, _wrapped)


@shortcut("check_dp_average", "a storage taken before the values, written out later", FOREIGN)
def dp_average_early_storage(grads, comm):
    posted_then(grads, comm, _early_handle, _wrapped)


@shortcut("check_dp_average", "a storage pickled through a global", FOREIGN)
def dp_average_pickled_storage(grads, comm):
    posted_then(grads, comm, lambda g: pickle.dumps(_held(g, typed=True)),
                lambda raw, g: torch.empty(0, dtype=g.dtype).set_(pickle.loads(raw)).view(
                    g.shape))


def _saved(g):
    buf = io.BytesIO()
    torch.save(_held(g, typed=True), buf)               # the zip writer reads it in C
    return buf.getvalue()


@shortcut("check_dp_average", "a storage through torch.save and torch.load", FOREIGN)
def dp_average_saved_storage(grads, comm):
    posted_then(grads, comm, _saved, lambda raw, g: torch.empty(0, dtype=g.dtype).set_(
        torch.load(io.BytesIO(raw), weights_only=True)).view(g.shape))


@shortcut("check_dp_average", "the C base's _write_file, by its name", "StorageBase")
def dp_average_base_write_file(grads, comm):
    def out(g):
        buf = io.BytesIO()
        torch._C.StorageBase._write_file(_held(g), buf, False, False, 1)
        return buf.getvalue()
    posted_then(grads, comm, out, _wrapped)


def _floats(t):
    """t's values through a storage's _write_file, as exact fractions."""
    buf = io.BytesIO()
    _held(t.reshape(-1).float())._write_file(buf, False, False, 1)
    return [Fraction(x) for x in struct.unpack(f"<{t.numel()}f", buf.getvalue())]


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 exact, read out by storage._write_file",
          "storage._write_file()")
def global_mean_var_write_file(counts, means, variances):
    w, c = means.shape
    m, v, n_r = _floats(means), _floats(variances), _floats(counts)
    n = sum(n_r)
    mean = [sum(n_r[r] * m[r * c + j] for r in range(w)) / n for j in range(c)]
    ex2 = [sum(n_r[r] * (v[r * c + j] + m[r * c + j] ** 2) for r in range(w)) / n
           for j in range(c)]
    return (torch.tensor([float(x) for x in mean]),
            torch.tensor([float(x - y ** 2) for x, y in zip(ex2, mean, strict=True)]))


@other("check_dp_average", "a scratch buffer freed as FSDP frees (resize_ of its storage)")
def dp_average_freed_buffer(grads, comm):
    for g in grads:
        buf = g.detach().clone()
        storage = buf.untyped_storage()
        assert storage.nbytes() == buf.numel() * buf.element_size() == storage.size()
        comm.all_reduce(buf)
        g.copy_(buf / comm.world)
        storage.resize_(0)                  # freed: the tensor keeps its shape, not its bytes
        storage.resize_(g.numel() * g.element_size())


@other("check_dp_average", "views shown to share memory by data_ptr()")
def dp_average_shared_views(grads, comm):
    for g in grads:
        flat = g.view(-1)
        same = flat.untyped_storage().data_ptr() == g.untyped_storage().data_ptr()
        assert same and not g.untyped_storage().is_shared()
        assert g.untyped_storage().element_size() == 1
        comm.all_reduce(flat)
        flat /= comm.world


def test_regrade_refuses_storage_routes():
    """fresh.regrade's fresh import watches the storages too."""
    for name, answer in (("check_dp_average", dp_average_set_from_file),
                         ("check_global_mean_var", global_mean_var_write_file)):
        try:
            fresh.regrade(name, answer)
        except AssertionError as e:
            assert "storage" in str(e) or FOREIGN in str(e), e
        else:
            raise AssertionError(f"{name}: a storage route passed fresh.regrade")


test_case = parametrize_cases(__name__)
