"""Every async call a World's rank launches must be waited for by that rank before it returns
(helpers/checks/_core/waits.py): the simulated Work completes as every rank launched it, so an
answer that never waits would get the right values here, and race on gloo and NCCL. Shortcuts
that never wait fail in the checks of several exercises; right answers that wait in any of the
ways runtime/work.py records pass (tests/check_cases.py)."""
import pytest
import torch
import torch.distributed as dist
from check_cases import dp_group, other, parametrize_cases, shortcut

import helpers
from helpers.checks._core.run import CheckFailed
from helpers.checks._core.world import World

NEVER = "was never waited for"
FIX = "call work.wait() (or future.wait()) before using the result"


# ---- dp_average (mesh2d.py) --------------------------------------------------------------------
@shortcut("check_dp_average", "async all-reduces never waited for",
          ["rank 0's all_reduce with async_op=True " + NEVER, FIX])
def dp_average_never_waited(grads, comm):
    for g in grads:         # (a division meanwhile fails sooner: test_checks_in_flight.py)
        dist.all_reduce(g, op=dist.ReduceOp.AVG, async_op=True)


@shortcut("check_dp_average", "then()-chained averages, the chained futures never waited for",
          ["all_reduce with async_op=True " + NEVER, FIX])
def dp_average_chain_never_waited(grads, comm):
    for g in grads:
        dist.all_reduce(g, async_op=True).get_future().then(
            lambda f: f.value()[0].div_(comm.world))


@other("check_dp_average", "then()-chained averages, the chained futures waited with wait_all")
def dp_average_chain_waited(grads, comm):
    group = dp_group(comm)
    torch.futures.wait_all([dist.all_reduce(g, async_op=True, group=group).get_future().then(
        lambda f: f.value()[0].div_(comm.world)) for g in grads])


@other("check_dp_average", "async all-reduces, each waited by polling is_completed()")
def dp_average_polled(grads, comm):
    works = [dist.all_reduce(g, async_op=True, group=dp_group(comm)) for g in grads]
    for g, work in zip(grads, works, strict=True):
        while not work.is_completed():
            pass
        g.div_(comm.world)


# ---- pipeline_forward (pipeline_dist.py): point to point ---------------------------------------
def _forward(stage, X, num_microbatches, batch_size, in_shape, wait):
    r, p, m = dist.get_rank(), dist.get_world_size(), num_microbatches
    outs, pending = [], []
    with torch.no_grad():
        for j, rows in enumerate(torch.arange(batch_size).tensor_split(m)):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                h = torch.empty(len(rows), *in_shape)
                dist.recv(h, r - 1)
            out = stage(h)
            if r < p - 1:
                pending.append(dist.isend(out.contiguous(), r + 1))
            outs.append(out)
    if wait:
        for work in pending:
            work.wait()
    return torch.cat(outs) if r == p - 1 else None


@shortcut("check_pipeline_forward", "isends never waited for",
          ["rank 0's isend to rank 1 " + NEVER, FIX])
def forward_isends_never_waited(stage, comm, X, num_microbatches, batch_size, in_shape):
    return _forward(stage, X, num_microbatches, batch_size, in_shape, wait=False)


# ---- ring_forward (context_parallel.py): batch_isend_irecv -------------------------------------
def _ring(q, k, v, wait_sends):
    r, w = dist.get_rank(), dist.get_world_size()
    acc, m, l = helpers.block_attention(q, k, v)
    sends = []
    for i in range(w - 1):
        k2, v2 = torch.empty_like(k), torch.empty_like(v)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, k, (r + 1) % w, tag=2 * i),
            dist.P2POp(dist.isend, v, (r + 1) % w, tag=2 * i + 1),
            dist.P2POp(dist.irecv, k2, (r - 1) % w, tag=2 * i),
            dist.P2POp(dist.irecv, v2, (r - 1) % w, tag=2 * i + 1)])
        for work in works[2:]:          # the receives
            work.wait()
        sends += works[:2]
        if wait_sends:
            for work in sends:
                work.wait()
            sends = []
        k, v = k2, v2
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    return acc / l[..., None]


@shortcut("check_ring_forward", "batch_isend_irecv, only the receives waited for",
          ["isend to rank 1 " + NEVER, FIX])
def ring_forward_sends_never_waited(q, k, v, comm):
    return _ring(q, k, v, wait_sends=False)


@other("check_ring_forward", "batch_isend_irecv, every send and receive waited for")
def ring_forward_batched(q, k, v, comm):
    return _ring(q, k, v, wait_sends=True)


# ---- gather_layer (fsdp_scratch.py) ------------------------------------------------------------
def _split(full, shapes):
    sizes = [s.numel() for s in shapes]
    return [p.reshape(s) for p, s in zip(full[:sum(sizes)].split(sizes), shapes, strict=True)]


@shortcut("check_gather_layer", "async all-gather never waited for",
          ["all_gather with async_op=True " + NEVER, FIX])
def gather_layer_never_waited(shard, shapes):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(full, shard, async_op=True)
    return _split(full, shapes)


@other("check_gather_layer", "async all-gather, its future's value waited for")
def gather_layer_future(shard, shapes):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    parts = dist.all_gather(parts, shard, async_op=True).get_future().wait()
    return _split(torch.cat(parts), shapes)


# ---- the rule on the World itself --------------------------------------------------------------
def test_an_irecv_never_waited_fails_the_run_naming_it():
    """An irecv never waited for (its message never taken) fails its rank, not a timeout; the
    isend it matched, waited for, does not."""
    def body(comm):
        t = torch.full((2,), float(comm.rank))
        if comm.rank == 0:
            dist.isend(t, 1).wait()
        else:
            dist.irecv(t, 0)
        return t
    with pytest.raises(CheckFailed, match="rank 1's irecv from rank 0 " + NEVER):
        World(2, timeout=5).run(body)


def test_waits_on_a_chained_future_or_a_result_count_for_the_work():
    """A wait on a then()-chained future, result() and a Work waited twice all leave nothing
    unwaited; the future taken alone, never waited, does."""
    def body(comm, wait):
        t = torch.ones(2)
        dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()).wait()
        dist.all_reduce(t, async_op=True).result()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        work.wait()
        fut = dist.all_reduce(t, async_op=True).get_future()
        if wait:
            fut.value()
        return t.clone() if wait else t     # (cloned unwaited: test_checks_in_flight.py)
    assert [t.tolist() for t in World(2).run(body, True)] == [[16.0, 16.0]] * 2
    with pytest.raises(CheckFailed, match="rank 0's all_reduce with async_op=True " + NEVER):
        World(2).run(body, False)


test_case = parametrize_cases(__name__)
