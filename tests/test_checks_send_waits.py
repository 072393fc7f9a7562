"""A wait for a send completes only once the peer has received it, on thread ranks as on gloo
and NCCL: "send, finish the sends with comm.wait(), then receive" in a cycle hangs every process
(each rank waits for a receive its peer posts only after its own wait), so on thread ranks it
fails at once as a deadlock naming each rank's blocking call and the fix, in the checks and in
launch(threads=True) alike; sends received before the wait, sendrecv, isendrecv and an
overlapped ring pass (helpers/runtime/thread_waits.py, tests/check_cases.py). A ring that waits
once at the end holds every block it sent until then, a computed copy sent (`k * 1.0`) too."""
import time

import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers.checks._core.world import World
from helpers.runtime.errors import Deadlock
from helpers.runtime.thread_world import ThreadWorld

DEADLOCK = ["deadlock", "waits in comm.wait() for its send to rank",
            "post the receives before waiting for the sends: comm.sendrecv / isendrecv, or "
            "receive before comm.wait()"]


# ---- ring_forward (context_parallel.ipynb) ------------------------------------------------------
@shortcut("check_ring_forward", "comm.wait() above the receives: the sends finished first",
          DEADLOCK)
def ring_waits_before_receiving(q, k, v, comm):
    r, w = comm.rank, comm.world
    acc, m, l = helpers.block_attention(q, k, v)
    for i in range(w - 1):
        comm.send(k, (r + 1) % w, tag=2 * i)
        comm.send(v, (r + 1) % w, tag=2 * i + 1)
        comm.wait()
        k = comm.recv((r - 1) % w, k.shape, tag=2 * i)
        v = comm.recv((r - 1) % w, v.shape, tag=2 * i + 1)
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    return acc / l[..., None]


def _ring_step(comm, k, v, i):
    r, w = comm.rank, comm.world
    return comm.isendrecv([(k, (r + 1) % w, 2 * i), (v, (r + 1) % w, 2 * i + 1)],
                          [((r - 1) % w, k.shape, k.dtype, 2 * i),
                           ((r - 1) % w, v.shape, v.dtype, 2 * i + 1)])


@other("check_ring_forward", "sendrecv for each block, then comm.wait()")
def ring_by_sendrecv(q, k, v, comm):
    r, w = comm.rank, comm.world
    acc, m, l = helpers.block_attention(q, k, v)
    for _ in range(w - 1):
        k2 = comm.sendrecv((k, (r + 1) % w), ((r - 1) % w, k.shape))
        v2 = comm.sendrecv((v, (r + 1) % w), ((r - 1) % w, v.shape))
        comm.wait()
        k, v = k2, v2
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    return acc / l[..., None]


@shortcut("check_ring_forward", "one comm.wait() at the end: every block sent held till then",
          ["sent and not yet waited for", "each step"])
def ring_waits_once_at_the_end(q, k, v, comm):
    r, w = comm.rank, comm.world
    acc, m, l = helpers.block_attention(q, k, v)
    for i in range(w - 1):
        comm.send(k, (r + 1) % w, tag=2 * i)
        comm.send(v, (r + 1) % w, tag=2 * i + 1)
        k = comm.recv((r - 1) % w, k.shape, tag=2 * i)
        v = comm.recv((r - 1) % w, v.shape, tag=2 * i + 1)
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    comm.wait()
    return acc / l[..., None]


def _ring_sending(q, k, v, comm, sent):
    """The ring, each block sent as `sent(block)`, and one comm.wait() at the end."""
    r, w = comm.rank, comm.world
    acc, m, l = helpers.block_attention(q, k, v)
    for i in range(w - 1):
        comm.send(sent(k), (r + 1) % w, tag=2 * i)
        comm.send(sent(v), (r + 1) % w, tag=2 * i + 1)
        k = comm.recv((r - 1) % w, k.shape, tag=2 * i)
        v = comm.recv((r - 1) % w, v.shape, tag=2 * i + 1)
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    comm.wait()
    return acc / l[..., None]


@shortcut("check_ring_forward", "sends k * 1.0 (a computed copy), one comm.wait() at the end",
          ["sent and not yet waited for", "each step"])
def ring_sends_copies_waits_once(q, k, v, comm):
    return _ring_sending(q, k, v, comm, lambda block: block * 1.0)


@shortcut("check_ring_forward", "sends (-k).neg(), one comm.wait() at the end",
          ["sent and not yet waited for", "each step"])
def ring_sends_negated_twice_waits_once(q, k, v, comm):
    return _ring_sending(q, k, v, comm, lambda block: (-block).neg())


@other("check_ring_forward", "isendrecv and the Exchange's wait()")
def ring_by_isendrecv(q, k, v, comm):
    acc, m, l = helpers.block_attention(q, k, v)
    for i in range(comm.world - 1):
        k, v = _ring_step(comm, k, v, i).wait()
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, k, v))
    return acc / l[..., None]


@other("check_ring_forward", "overlapped: post the next exchange, compute, then wait")
def ring_overlapped(q, k, v, comm):
    acc = m = l = None
    for i in range(comm.world):
        exchange = _ring_step(comm, k, v, i) if i < comm.world - 1 else None
        block = helpers.block_attention(q, k, v)
        acc, m, l = block if acc is None else helpers.merge_blocks(acc, m, l, *block)
        if exchange is not None:
            k, v = exchange.wait()
    return acc / l[..., None]


# ---- tokens_to_heads (context_parallel.ipynb) ---------------------------------------------------
@shortcut("check_tokens_to_heads", "every piece sent, comm.wait(), then every receive", DEADLOCK)
def heads_wait_before_receiving(x, comm):
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    for j in range(w):
        if j != r:
            comm.send(pieces[j].contiguous(), j, tag=5)
    comm.wait()
    got = [pieces[r] if j == r else comm.recv(j, pieces[j].shape, tag=5) for j in range(w)]
    return torch.cat(got, dim=2)


@shortcut("check_tokens_to_heads", "per peer: send, comm.wait(), receive", DEADLOCK)
def heads_send_wait_each(x, comm):
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    got = []
    for j in range(w):
        if j == r:
            got.append(pieces[r])
            continue
        comm.send(pieces[j].contiguous(), j, tag=5)
        comm.wait()
        got.append(comm.recv(j, pieces[j].shape, tag=5))
    return torch.cat(got, dim=2)


@other("check_tokens_to_heads", "one isendrecv of every piece, its wait()")
def heads_by_isendrecv(x, comm):
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    peers = [j for j in range(w) if j != r]
    got = comm.isendrecv([(pieces[j].contiguous(), j, 5) for j in peers],
                         [(j, pieces[j].shape, x.dtype, 5) for j in peers]).wait()
    mine = dict(zip(peers, got, strict=True)) | {r: pieces[r]}
    return torch.cat([mine[j] for j in range(w)], dim=2)


# ---- dispatch_tokens (expert_parallel.ipynb) ----------------------------------------------------
def _dispatch(x, dest, comm, wait_first):
    w, r = comm.world, comm.rank
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=w)
    for j in range(w):
        if j != r:
            comm.send(counts[j:j + 1].clone(), j, tag=7)
    if wait_first:
        comm.wait()
    incoming = [int(counts[r]) if j == r else
                int(comm.recv(j, (1,), tag=7, dtype=counts.dtype)[0]) for j in range(w)]
    comm.wait()
    return comm.all_to_all(x[order], counts.tolist(), incoming)


@shortcut("check_dispatch_tokens", "counts sent, comm.wait(), then received", DEADLOCK)
def dispatch_counts_wait_first(x, dest, comm):
    return _dispatch(x, dest, comm, wait_first=True)


@other("check_dispatch_tokens", "counts sent, received, then comm.wait()")
def dispatch_counts_received_first(x, dest, comm):
    return _dispatch(x, dest, comm, wait_first=False)


test_case = parametrize_cases(__name__)


# ---- the thread world itself --------------------------------------------------------------------
def _ring(comm, wait_first):
    r, w = comm.rank, comm.world
    comm.send(torch.full((2,), float(r)), (r + 1) % w)
    if wait_first:
        comm.wait()
    got = comm.recv((r - 1) % w, (2,))
    comm.wait()
    return got[0].item()


def test_launch_on_threads_ends_a_send_wait_deadlock_at_once():
    def target(rank, world, cfg):
        return _ring(cfg["comm"], cfg["wait_first"])
    t0 = time.monotonic()
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(target, 3, dict(wait_first=True), threads=True, timeout=60)
    took = time.monotonic() - t0
    assert isinstance(info.value.original, Deadlock) and took < 10, took
    words = str(info.value)
    assert all(f"rank {r} waits in comm.wait() for its send to rank {(r + 1) % 3}" in words
               for r in range(3)) and DEADLOCK[2] in words, words
    assert helpers.launch(target, 3, dict(wait_first=False), threads=True) == [2.0, 0.0, 1.0]


def test_a_send_waits_for_its_receive_and_a_cycle_of_receives_is_a_deadlock():
    order = []

    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.ones(1), 1)
            comm.wait()                  # returns only once rank 1 received
            order.append("waited")
        else:
            time.sleep(0.3)
            order.append("received")
            comm.recv(0, (1,))
    ThreadWorld(2, timeout=30).run(fn)
    assert order == ["received", "waited"]
    t0 = time.monotonic()
    with pytest.raises(Deadlock, match="rank 0 waits in recv for a message from rank 1"):
        ThreadWorld(2, timeout=30).run(lambda comm: comm.recv(1 - comm.rank, (1,)))
    assert time.monotonic() - t0 < 10


def test_torch_distributed_sends_complete_when_received():
    """In the grader's World: a blocking dist.send in a cycle deadlocks; an isend's work is not
    completed until the peer received it; irecvs posted before the sends' waits pass."""
    def blocking(comm):
        dist.send(torch.ones(1), 1 - comm.rank)
        dist.recv(torch.zeros(1), 1 - comm.rank)
    with pytest.raises(Deadlock, match="waits in dist.send to rank"):
        World(2, timeout=30).run(blocking)

    def probe(comm):
        if comm.rank == 0:
            work = dist.isend(torch.ones(1), 1)
            before = work.is_completed()
            dist.barrier()
            work.wait()
            return before, work.is_completed()
        dist.barrier()
        dist.recv(torch.zeros(1), 0)
    assert World(2, timeout=30).run(probe)[0] == (False, True)

    def batched(comm):
        peer, buf = 1 - comm.rank, torch.zeros(1)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(1), peer),
                                        dist.P2POp(dist.irecv, buf, peer)])
        for w in works:                  # the send's wait first: the irecv is posted already
            w.wait()
        return buf.item()
    assert World(2, timeout=30).run(batched) == [1.0, 1.0]
