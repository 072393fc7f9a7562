"""A rank that reads or writes the tensors of its own async call before waiting for it fails
(helpers/checks/_core/inflight.py): the simulated collective completes as it launches, so the
values come out right here, and race on gloo and NCCL. Reading in a then() callback, after the
wait, or launching a second collective on another tensor meanwhile passes (check_cases.py)."""
import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

from helpers.checks._core.run import CheckFailed
from helpers.checks._core.world import World

FIX = "wait() for the work before reading or writing its tensors"


# ---- overlap_hooks (ddp_scratch.py) ------------------------------------------------------------
@shortcut("check_overlap_hooks", "divides the gradient in the hook while its all-reduce runs",
          ["ran torch's div_ on the tensor of rank", "all_reduce with async_op=True", FIX])
def overlap_div_in_flight(model):
    handles = []

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))
        p.grad.div_(dist.get_world_size())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
    return finish


@other("check_overlap_hooks", "the average in a then() callback of the all-reduce's future")
def overlap_then_divides(model):
    futures = []

    def hook(p):
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        futures.append(fut.then(lambda f: f.value()[0].div_(dist.get_world_size())))
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.wait_all(futures)
        futures.clear()
    return finish


@other("check_overlap_hooks", "every gradient's all-reduce in flight at once, each divided "
       "after its wait")
def overlap_wait_then_divide(model):
    pending = []

    def hook(p):
        pending.append((dist.all_reduce(p.grad, async_op=True), p.grad))
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work, grad in pending:
            work.wait()
            grad.div_(dist.get_world_size())
        pending.clear()
    return finish


# ---- grad_shard (zero.py) ----------------------------------------------------------------------
def _shard(flat_grad, between):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_zeros(flat.numel() // world)
    work = dist.reduce_scatter_tensor(out, flat, async_op=True)
    res = between(out, flat, world)
    work.wait()
    return out if res is None else res


@shortcut("check_grad_shard", "reads the reduce-scatter's output before the wait",
          ["ran torch's div on the output of rank", "reduce_scatter", FIX])
def grad_shard_read_before_wait(flat_grad):
    return _shard(flat_grad, lambda out, flat, world: out / world)


@shortcut("check_grad_shard", "divides the output (a view of it) while the reduce-scatter runs",
          ["ran torch's div_ on the output of rank", FIX])
def grad_shard_div_in_flight(flat_grad):
    def divide(out, flat, world):
        out[:].div_(world)
    return _shard(flat_grad, divide)


@other("check_grad_shard", "waits, then divides the output")
def grad_shard_wait_then_divide(flat_grad):
    return _shard(flat_grad, lambda out, flat, world: None).div_(dist.get_world_size())


# ---- average_bucket (ddp_scratch.py) -----------------------------------------------------------
def _unflatten(flat, grads):
    o = 0
    for g in grads:
        g.copy_(flat[o:o + g.numel()].view_as(g))
        o += g.numel()


@shortcut("check_average_bucket", "divides the bucket while its all-reduce runs",
          ["ran torch's div_ on the tensor of rank", FIX])
def average_bucket_div_in_flight(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    work = dist.all_reduce(flat, async_op=True)
    flat /= dist.get_world_size()
    work.wait()
    _unflatten(flat, grads)


# ---- clip_sharded (fsdp_scratch.py) ------------------------------------------------------------
@shortcut("check_clip_sharded", "takes the norm and scales the gradients before the wait",
          ["ran torch's sqrt on the tensor of rank", FIX])
def clip_read_before_wait(shards, max_norm):
    sq = torch.zeros(())
    for p in shards:
        sq += p.grad.pow(2).sum()
    work = dist.all_reduce(sq, async_op=True)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    work.wait()
    return norm


# ---- pipeline_forward (pipeline_dist.py) -------------------------------------------------------
@shortcut("check_pipeline_forward", "writes each output into one buffer an isend still reads",
          ["ran torch's copy_ on the buffer of rank", "isend to rank", FIX])
def forward_reused_send_buffer(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = dist.get_rank(), dist.get_world_size(), num_microbatches
    outs, pending, buf = [], [], None
    with torch.no_grad():
        for j, rows in enumerate(torch.arange(batch_size).tensor_split(m)):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                h = torch.empty(len(rows), *in_shape)
                dist.recv(h, r - 1)
            out = stage(h)
            if r < p - 1:
                if buf is None:
                    buf = out.new_empty(batch_size, out.shape[-1])
                buf[:len(rows)].copy_(out)
                pending.append(dist.isend(buf[:len(rows)], r + 1))
            outs.append(out)
    for work in pending:
        work.wait()
    return torch.cat(outs) if r == p - 1 else None


# ---- the World itself ---------------------------------------------------------------------------
def _exchange(comm, touch):
    """Rank 0 isends a tensor and irecvs one from rank 1 (and rank 1 the mirror), touching
    `touch(sent, got)` before waiting."""
    peer = 1 - comm.rank
    sent, got = torch.full((4,), float(comm.rank)), torch.zeros(4)
    works = [dist.isend(sent, peer), dist.irecv(got, peer)]
    touch(sent, got)
    for work in works:
        work.wait()
    return got.clone()


def test_reading_an_isend_buffer_meanwhile_passes_writing_it_fails():
    assert [t.tolist() for t in World(2).run(_exchange, lambda s, g: s.sum())] == [
        [1.0] * 4, [0.0] * 4]
    # both ranks write their own buffer: whichever reports first is named
    with pytest.raises(CheckFailed, match="ran torch's mul_ on the buffer of rank [01]'s isend"):
        World(2).run(_exchange, lambda s, g: s[1:].mul_(2))


def test_reading_an_irecv_buffer_before_its_wait_fails_even_caught():
    def peek(sent, got):
        try:
            got.sum()
        except CheckFailed:
            pass
    with pytest.raises(CheckFailed, match="ran torch's sum on the buffer of rank [01]'s irecv"):
        World(2).run(_exchange, peek)


def test_a_done_callback_reads_and_a_wait_frees_the_tensors():
    def body(comm):
        t, seen = torch.ones(3), []
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut.add_done_callback(lambda f: seen.append(f.value()[0].sum()))
        other = dist.all_reduce(torch.ones(2), async_op=True)   # a second one meanwhile
        fut.wait()
        other.wait()
        return torch.stack([seen[0], t.sum()])
    assert [t.tolist() for t in World(2).run(body)] == [[6.0, 6.0]] * 2


test_case = parametrize_cases(__name__)
