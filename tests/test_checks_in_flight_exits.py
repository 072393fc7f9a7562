"""An async call's tensors read out of torch without an aten operation (`.tolist()`, `.numpy()`,
`np.asarray`, printing: exits.py) before the rank's wait fail as an aten read does
(helpers/checks/_core/inflight.py): on thread ranks the values are already right, on gloo and
NCCL the buffer is still being written. Reading after the wait, in a then() callback, or an
isend's buffer meanwhile passes (check_cases.py)."""
import re
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers.checks._core.run import CheckFailed
from helpers.checks._core.world import World

FIX = "wait() for the work before reading or writing its tensors"


# ---- grad_shard (zero.py): an async reduce-scatter -----------------------------------------
def _shard(flat_grad, between):
    """The reduce-scatter's output, `between(out)` run before its wait (its result, if any,
    replaces the output)."""
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_zeros(flat.numel() // world)
    work = dist.reduce_scatter_tensor(out, flat, async_op=True)
    got = between(out)
    work.wait()
    return (out if got is None else got) / world


@shortcut("check_grad_shard", "reads the reduce-scatter's output with .tolist() before the wait",
          ["rank", "read the output of rank", "reduce_scatter", "(.tolist())", FIX])
def grad_shard_tolist_before_wait(flat_grad):
    return _shard(flat_grad, lambda out: torch.tensor(out.tolist()))


@shortcut("check_grad_shard", "reads the reduce-scatter's output with .numpy() before the wait",
          ["read the output of rank", "(.numpy())", FIX])
def grad_shard_numpy_before_wait(flat_grad):
    return _shard(flat_grad, lambda out: torch.from_numpy(out.numpy().copy()))


@shortcut("check_grad_shard", "reads the output with .tolist() in a thread it starts, caught",
          ["read the output of rank", "(.tolist())", FIX])
def grad_shard_tolist_in_a_thread(flat_grad):
    def read(out):
        seen = []

        def tolist():           # the refusal caught: it fails all the same
            try:
                seen.append(out.tolist())
            except AssertionError:
                pass
        reader = threading.Thread(target=tolist)
        reader.start()
        reader.join()
        return torch.tensor(seen[0]) if seen else None
    return _shard(flat_grad, read)


@other("check_grad_shard", "waits, then reads the output with .tolist() and .numpy()")
def grad_shard_reads_after_wait(flat_grad):
    got = _shard(flat_grad, lambda out: None)
    as_numpy = torch.from_numpy(got.float().numpy().copy()).to(got.dtype)   # numpy: no bf16
    return torch.tensor(got.tolist(), dtype=got.dtype) + as_numpy * 0


# ---- average_bucket (ddp_scratch.py): an async all-reduce of a flat bucket ------------------
def _average(grads, before_wait):
    flat = torch.cat([g.reshape(-1) for g in grads])
    work = dist.all_reduce(flat, async_op=True)
    values = before_wait(flat)
    work.wait()
    values = flat.tolist() if values is None else values
    o = 0
    for g in grads:
        g.copy_(torch.tensor(values[o:o + g.numel()]).view_as(g) / dist.get_world_size())
        o += g.numel()


@shortcut("check_average_bucket", "reads the bucket with .tolist() before the wait",
          ["read the tensor of rank", "all_reduce with async_op=True (.tolist())", FIX])
def average_bucket_tolist_before_wait(grads):
    _average(grads, lambda flat: flat.tolist())


@shortcut("check_average_bucket", "reads the bucket with np.asarray() before the wait",
          ["read the tensor of rank", "(np.asarray())", FIX])
def average_bucket_asarray_before_wait(grads):
    _average(grads, lambda flat: np.asarray(flat).tolist())


@other("check_average_bucket", "waits, then reads the bucket with .tolist()")
def average_bucket_tolist_after_wait(grads):
    _average(grads, lambda flat: None)


# ---- overlap_hooks (ddp_scratch.py): the gradient's all-reduce, from its hook ----------------
def _overlap(model, in_hook):
    handles, world = [], dist.get_world_size()

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))
        in_hook(p.grad)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.copy_(torch.from_numpy(p.grad.numpy() / world))
    return finish


@shortcut("check_overlap_hooks", "logs the gradient with .tolist() while its all-reduce runs",
          ["read the tensor of rank", "all_reduce with async_op=True (.tolist())", FIX])
def overlap_hooks_tolist_in_flight(model):
    return _overlap(model, lambda grad: grad.tolist())


@shortcut("check_overlap_hooks", "takes the gradient's .numpy() while its all-reduce runs",
          ["read the tensor of rank", "(.numpy())", FIX])
def overlap_hooks_numpy_in_flight(model):
    return _overlap(model, lambda grad: grad.numpy().max())


@other("check_overlap_hooks", "waits in finish(), then averages through .numpy()")
def overlap_hooks_numpy_after_wait(model):
    return _overlap(model, lambda grad: None)


# ---- ring_forward (context_parallel.py): batch_isend_irecv ---------------------------------
def _ring(q, k, v, before_wait):
    r, w = dist.get_rank(), dist.get_world_size()
    acc, m, l = helpers.block_attention(q, k, v)
    for i in range(w - 1):
        k2, v2 = torch.empty_like(k), torch.empty_like(v)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, k, (r + 1) % w, tag=2 * i),
            dist.P2POp(dist.isend, v, (r + 1) % w, tag=2 * i + 1),
            dist.P2POp(dist.irecv, k2, (r - 1) % w, tag=2 * i),
            dist.P2POp(dist.irecv, v2, (r - 1) % w, tag=2 * i + 1)])
        before_wait(k, k2)
        for work in works:
            work.wait()
        k, v = k2, v2
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    return acc / l[..., None]


@shortcut("check_ring_forward", "reads the irecv's buffer with .tolist() before its wait",
          ["read the buffer of rank", "irecv from rank", "(.tolist())", FIX])
def ring_forward_irecv_tolist_before_wait(q, k, v, comm):
    return _ring(q, k, v, lambda sent, got: got.tolist())


# ---- pipeline_forward (pipeline_dist.py): irecv, isend -----------------------------------------
def _forward(stage, X, num_microbatches, batch_size, in_shape, peek):
    """Each micro-batch's input irecv'd and its output isent, `peek(got, sent)` run on the
    buffers before their waits (got: the irecv's, None on rank 0; sent: the isend's, or None)."""
    r, p, m = dist.get_rank(), dist.get_world_size(), num_microbatches
    outs, pending = [], []
    with torch.no_grad():
        for j, rows in enumerate(torch.arange(batch_size).tensor_split(m)):
            h = X.tensor_split(m)[j] if r == 0 else torch.empty(len(rows), *in_shape)
            got = dist.irecv(h, r - 1) if r > 0 else None
            peek(h if got else None, None)
            if got:
                got.wait()
            out = stage(torch.from_numpy(h.numpy().copy()))    # read after its wait
            if r < p - 1:
                pending.append(dist.isend(out, r + 1))
                peek(None, out)
            outs.append(out)
    for work in pending:
        work.wait()
    return torch.cat(outs) if r == p - 1 else None


@shortcut("check_pipeline_forward", "reads the irecv's buffer with .tolist() before its wait",
          ["read the buffer of rank", "irecv from rank", "(.tolist())", FIX])
def forward_irecv_tolist_before_wait(stage, comm, X, num_microbatches, batch_size, in_shape):
    return _forward(stage, X, num_microbatches, batch_size, in_shape,
                    lambda got, sent: got is not None and got.tolist())


@other("check_pipeline_forward", "irecv waited, then read with .numpy(); each isent output "
       "read with .tolist() while the isend runs (a send only reads it)")
def forward_reads_sent_output(stage, comm, X, num_microbatches, batch_size, in_shape):
    return _forward(stage, X, num_microbatches, batch_size, in_shape,
                    lambda got, sent: sent is not None and sent.tolist())


# ---- the World itself -------------------------------------------------------------------------
def _all_reduce(read):
    def body(comm):
        t = torch.ones(3) * (comm.rank + 1)
        fut = dist.all_reduce(t, async_op=True).get_future()
        seen = [None]
        fut.add_done_callback(lambda f: seen.__setitem__(0, f.value()[0].tolist()))
        read(t)
        fut.wait()
        return torch.tensor(seen[0] + t.tolist())
    return body


@pytest.mark.parametrize("read, how", [(repr, "printing (repr)"),
                                       (lambda t: t.untyped_storage()[0], "storage[i]")])
def test_printing_or_a_storage_read_before_the_wait_fails(read, how):
    words = f"all_reduce with async_op=True ({how}) before waiting for it"
    with pytest.raises(CheckFailed, match=r"read the tensor of rank \d's " + re.escape(words)):
        World(2).run(_all_reduce(read))


def _write_file(path):
    def write(sent):
        with open(path, "rb") as f:
            sent.untyped_storage()._set_from_file(f, 0, True, 4)
    return write


@pytest.mark.parametrize("how", ["storage._set_from_file()", ".apply_()"])
def test_an_isend_buffer_written_outside_aten_before_the_wait_fails(tmp_path, how):
    """Reading an isend's buffer meanwhile passes (above); writing it without an aten operation,
    from a file into its storage or element by element in Python, fails as a write does."""
    path = tmp_path / "seven"
    with open(path, "wb") as f:
        torch.full((4,), 7.0).untyped_storage()._write_file(f, True, True, 4)
    write = _write_file(path) if how.startswith("storage") else (
        lambda sent: sent.apply_(lambda x: x + 1))

    def body(comm):
        sent, got = torch.ones(4), torch.zeros(4)
        works = [dist.isend(sent, 1 - comm.rank), dist.irecv(got, 1 - comm.rank)]
        write(sent)
        for work in works:
            work.wait()
        return got
    with pytest.raises(CheckFailed, match=r"wrote the buffer of rank \d's isend to rank \d " +
                       re.escape(f"({how}) before waiting for it")):
        World(2).run(body)


def test_a_callback_reads_and_shape_or_address_reads_nothing():
    def meta(t):
        return t.shape, t.data_ptr(), t.untyped_storage().nbytes()
    assert [t.tolist() for t in World(2).run(_all_reduce(meta))] == [[3.0] * 6] * 2


test_case = parametrize_cases(__name__)
