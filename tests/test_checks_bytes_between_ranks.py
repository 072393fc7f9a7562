"""Shortcut answers that carry tensors between thread ranks as bytes fail (tests/check_cases.py's
form): one rank pickles or torch.saves its tensor into a module global, another rebuilds it
(pickle.loads, torch.load, a storage made from the bytes, read as another dtype) after a decoy
collective. Torch rebuilds such a storage in C, with no operation a rank made, so provenance.py
judges it by its values. Right answers that round-trip their own tensors through bytes pass."""
import ctypes
import io
import pickle

import torch
import torch.distributed as dist
from check_cases import dp_peers, other, parametrize_cases, shortcut

REBUILT = "rebuilt a tensor from bytes"
FOREIGN = "read out of its own tensors"
_BYTES = {}


def _decoy_then(grads, comm, rebuild):
    """Each gradient: a zeros all-reduce of its size (the bytes a right answer sends), then
    the mean of every rank's copy rebuilt from the global."""
    for i, g in enumerate(grads):
        decoy = torch.zeros_like(g)
        comm.all_reduce(decoy)              # every rank has written _BYTES when this returns
        g.copy_(decoy + sum(rebuild(_BYTES[q], i) for q in dp_peers(comm)) / comm.world)


@shortcut("check_dp_average", "other ranks' gradients pickled through a global", REBUILT)
def dp_average_pickled(grads, comm):
    _BYTES[dist.get_rank()] = pickle.dumps([g.clone() for g in grads])
    _decoy_then(grads, comm, lambda b, i: pickle.loads(b)[i])


@shortcut("check_dp_average", "other ranks' gradients through torch.save and torch.load",
          REBUILT)
def dp_average_saved(grads, comm):
    buf = io.BytesIO()
    torch.save([g.clone() for g in grads], buf)
    _BYTES[dist.get_rank()] = buf.getvalue()
    _decoy_then(grads, comm,
                lambda b, i: torch.load(io.BytesIO(b), weights_only=False)[i])


def _from_storage(b, i):
    shapes, raw = b
    storage = torch.UntypedStorage.from_buffer(raw[i], dtype=torch.uint8)
    return torch.empty(0).set_(storage, 0, shapes[i])


@shortcut("check_dp_average", "a storage made from other ranks' bytes", REBUILT)
def dp_average_storage_from_bytes(grads, comm):
    _BYTES[dist.get_rank()] = ([g.shape for g in grads],
                         [bytes(g.clone().untyped_storage()) for g in grads])
    _decoy_then(grads, comm, _from_storage)


def _as_float32(b, i):
    """Unpickled as half floats, then viewed as the float32 values they hold."""
    return pickle.loads(b)[i].view(torch.float32)


@shortcut("check_dp_average", "pickled viewed as float16, viewed back as float32", FOREIGN)
def dp_average_pickled_as_halves(grads, comm):
    _BYTES[dist.get_rank()] = pickle.dumps([g.reshape(-1).view(torch.float16) for g in grads])
    _decoy_then(grads, comm, lambda b, i: _as_float32(b, i).view_as(grads[i]))


@shortcut("check_sync_bn_input_grad", "the sums pickled through a global", REBUILT)
def sync_bn_input_grad_pickled(dy, x_hat, invstd, n):
    w, r = dist.get_world_size(), dist.get_rank()
    mine = torch.cat([dy.sum(0), (dy * x_hat).sum(0)])
    _BYTES[r] = pickle.dumps(mine)
    decoy = torch.zeros_like(mine)
    dist.all_reduce(decoy)
    sums = decoy + sum(pickle.loads(_BYTES[q]) for q in range(w))
    m1, m2 = (sums / n).chunk(2)
    return invstd * (dy - m1 - x_hat * m2)


@shortcut("check_dp_average", "other ranks' gradients copied with ctypes at their data_ptr()",
          "ctypes")
def dp_average_ctypes(grads, comm):
    _BYTES[dist.get_rank()] = [g.clone() for g in grads]      # held: their memory stays valid

    def copied(held, i):
        out = torch.empty_like(grads[i])
        ctypes.memmove(out.data_ptr(), held[i].data_ptr(), out.numel() * out.element_size())
        return out
    _decoy_then(grads, comm, copied)


@other("check_dp_average", "each rank's own gradients round-tripped through pickle and save")
def dp_average_own_bytes(grads, comm):
    for g in grads:
        mine = pickle.loads(pickle.dumps(g.detach().clone()))
        buf = io.BytesIO()
        torch.save(mine.view(torch.int32), buf)
        mine = torch.load(io.BytesIO(buf.getvalue()), weights_only=False).view(torch.float32)
        comm.all_reduce(mine)
        g.copy_(mine / comm.world)


@other("check_sync_bn_input_grad", "the rank's own sums round-tripped through pickle")
def sync_bn_input_grad_own_bytes(dy, x_hat, invstd, n):
    sums = pickle.loads(pickle.dumps(torch.cat([dy.sum(0), (dy * x_hat).sum(0)])))
    dist.all_reduce(sums)
    m1, m2 = (sums / n).chunk(2)
    return invstd * (dy - m1 - x_hat * m2)


test_case = parametrize_cases(__name__)
