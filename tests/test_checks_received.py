"""Traffic whose data never reaches the result fails (tests/check_cases.py's form): each
answer sends and receives exactly what the exercise asks for (the right peers, sizes and
payloads), then computes its result from something else, so its messages are decoration. The
data here travels past the comm through a tensor every rank shares, written with ctypes
(provenance.py's documented limit): any leak nobody has found yet, or a recomputation from data
a rank already had, reads the same. world.py's `expect_from_messages` refuses them all: a
rank's result must be computed from what the network delivered to it."""
import math

import torch
import torch.distributed as dist
from check_cases import dp_peers, other, parametrize_cases, raw_copy, shortcut

import helpers

DECOR = "does not depend on what it received"

_BOARD = torch.zeros(1 << 16)     # made at import, before any World: no rank owns it
_SLOT = 1 << 12                   # elements per rank


def _post(slot, *tensors):
    """Write tensors on the board (a rank's slot) with ctypes: no aten operation sees it."""
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    raw_copy(_BOARD.data_ptr() + 4 * slot * _SLOT, flat.data_ptr(), 4 * flat.numel())


def _read(slot, *shapes):
    """The tensors posted in `slot`, read back (in torch) by whichever rank asks."""
    out, at = [], slot * _SLOT
    for s in shapes:
        n = math.prod(s)
        out.append(_BOARD[at:at + n].clone().reshape(s))
        at += n
    return out


# ---- a data-parallel average: the all-reduce runs, the mean comes from the board ----------------
@shortcut("check_dp_average", "all-reduces clones of its gradients, averages the board", DECOR)
def dp_average_decoy(grads, comm):
    k, r = comm.world, dist.get_rank()
    _post(r, *grads)
    for g in grads:
        comm.all_reduce(g.clone())             # the right size, the right payload: dropped
    shapes = [g.shape for g in grads]
    for i, g in enumerate(grads):
        g.copy_(sum(_read(j, *shapes)[i] for j in dp_peers(comm)) / k)


@shortcut("check_dp_average", "all-reduces in place, then overwrites with copy_", DECOR)
def dp_average_overwritten(grads, comm):
    k, r = comm.world, dist.get_rank()
    _post(r, *grads)
    for g in grads:
        comm.all_reduce(g)                     # delivered into g ... then written over whole
    shapes = [g.shape for g in grads]
    for i, g in enumerate(grads):
        g.copy_(sum(_read(j, *shapes)[i] for j in dp_peers(comm)) / k)


@other("check_dp_average", "all-reduce, then the average made through Python floats")
def dp_average_through_python(grads, comm):
    for g in grads:
        comm.all_reduce(g)
        g.copy_(torch.tensor([v / comm.world for v in g.reshape(-1).tolist()]).view_as(g))


# ---- ring attention: K and V go round the ring, the blocks used come from the board -------------
@shortcut("check_ring_forward", "the ring runs, the blocks come from the board", DECOR)
def ring_forward_decoy(q, k, v, comm):
    r, w = comm.rank, comm.world
    _post(r, k, v)
    acc, m, l = helpers.block_attention(q, k, v)
    kv = torch.stack([k, v])
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)           # the right block arrives ...
        kb, vb = _read((r - 1 - i) % w, k.shape, v.shape)      # ... the board's is used
        o, mb, lb = helpers.block_attention(q, kb, vb)
        acc, m, l = helpers.merge_blocks(acc, m, l, o, mb, lb)
    comm.wait()
    return acc / l[..., None]


# ---- expert dispatch: rows exchanged by hand, the board's rows returned --------------------------
@shortcut("check_dispatch_tokens", "rows exchanged, the board's rows returned", DECOR)
def dispatch_tokens_decoy(x, dest, comm):
    w, r = comm.world, comm.rank
    for j in range(w):
        if j != r:
            _post(r * w + j, x[dest == j])                 # slot (from, to)
            comm.send(torch.tensor([int((dest == j).sum())]), j, tag=7)
            comm.send(x[dest == j], j, tag=8)
    got = []
    for j in range(w):
        if j == r:
            got.append(x[dest == r])
            continue
        n = int(comm.recv(j, (1,), tag=7, dtype=torch.int64))
        comm.recv(j, (n, x.shape[1]), tag=8)               # the rows arrive ...
        got.extend(_read(j * w + r, (n, x.shape[1])))      # ... the board's are returned
    comm.wait()
    return torch.cat(got)


# ---- a forward pipeline: micro-batches travel, the last stage reads the board -------------------
@shortcut("check_pipeline_forward", "micro-batches travel, the last stage reads the board", DECOR)
def pipeline_forward_decoy(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    outs = []
    with torch.no_grad():
        for j in range(m):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                got = comm.recv(r - 1, (rows[j], *in_shape), tag=j)
                h = got if r < p - 1 else _read(r - 1, (batch_size, *in_shape))[0][
                    sum(rows[:j]):sum(rows[:j + 1])]
            out = stage(h)
            outs.append(out)
            if r < p - 1:
                if r == p - 2:   # the outputs so far on the board, before micro-batch j is sent
                    _post(r, torch.cat(outs))
                comm.send(out, r + 1, tag=j)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


@other("check_pipeline_forward", "dist.recv into a buffer, the stage's output written back")
def pipeline_forward_into_buffers(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = dist.get_rank(), dist.get_world_size(), num_microbatches
    pieces = torch.arange(batch_size).tensor_split(m)
    out = None
    with torch.no_grad():
        for j, rows in enumerate(pieces):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                h = torch.empty(len(rows), *in_shape)
                dist.recv(h, r - 1, tag=j)
            y = stage(h)
            if out is None:
                out = torch.empty(batch_size, *y.shape[1:])
            out[rows[0]:rows[-1] + 1].copy_(y)          # a partial write: the rest stays
            if r < p - 1:
                dist.send(y, r + 1, tag=j)
    return out if r == p - 1 else None


test_case = parametrize_cases(__name__)


# ---- the harness itself ------------------------------------------------------------------------
def test_a_whole_overwrite_cuts_the_dataflow_and_a_partial_one_does_not():
    from helpers.checks._core import Recorder
    with Recorder() as rec:
        a, b = torch.ones(4), torch.zeros(4)
        a.add_(1)
        kept = (rec.latest(a),)
        b.copy_(a)
        assert rec.depends_on([b], kept)
        b.copy_(torch.zeros(4))                         # all of b: a no longer flows into it
        assert not rec.depends_on([b], kept)
        b[:2].copy_(a[:2])
        b[2:].copy_(torch.zeros(2))                    # half of b each time: a still does
        assert rec.depends_on([b], kept)


def test_the_world_keeps_what_each_rank_received():
    from helpers.checks._core import World
    w = World(2, record_ops=True)

    def body(comm):
        mine = torch.full((3,), float(comm.rank + 1))
        comm.send(mine * 2, 1 - comm.rank)
        got = comm.recv(1 - comm.rank, (3,))
        comm.wait()
        return got + mine, mine * 3
    out = w.run(body)
    for r, (used, unused) in enumerate(out):
        assert w.uses_received(r, used) and not w.uses_received(r, unused)
