"""A thread rank's comm.send (and the sends of isendrecv and sendrecv) leaves its tensor in flight
until the rank's comm.wait() (the Exchange's wait() for isendrecv), as DistComm's isend does on
gloo and NCCL: ThreadComm copies the tensor at once, so an answer that writes into (or reuses) a
buffer it sent before waiting gets the right numbers here, and races on processes. Such answers
fail naming the wait; so does a rank that returns with sends never waited for. Reading a sent
tensor meanwhile, a fresh tensor per send, a clone, or a wait before the reuse pass
(helpers/checks/_core/inflight.py and waits.py, tests/check_cases.py)."""
import re

import pytest
import torch
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers.checks._core.run import CheckFailed
from helpers.checks._core.world import World
from helpers.runtime.thread_world import ThreadWorld

WAIT = "call comm.wait() before writing a tensor you passed to comm.send"
HOP = "call the wait() of the Exchange isendrecv returned"
NEVER = "was never waited for"


# ---- pipeline_forward (pipeline_dist.ipynb) ----------------------------------------------------
def _forward(stage, comm, X, m, batch_size, in_shape, send):
    """The forward-only pipeline, each output handed to `send(out, j, rows)` on the way on."""
    r, p = comm.rank, comm.world
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    outs = []
    with torch.no_grad():
        for j in range(m):
            h = X.tensor_split(m)[j] if r == 0 else comm.recv(r - 1, (rows[j], *in_shape), tag=j)
            out = stage(h)
            if r < p - 1:
                send(out, j, rows[j])
            outs.append(out)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


def _one_buffer(comm, wait_first):
    """A send(out, j, rows) that stages every output in one preallocated buffer (waiting for the
    sends before each reuse when `wait_first`)."""
    buf = []

    def send(out, j, rows):
        if not buf:
            buf.append(out.new_empty(rows, out.shape[-1]))     # the first is the largest
        if wait_first:
            comm.wait()
        buf[0][:rows].copy_(out)
        comm.send(buf[0][:rows], comm.rank + 1, tag=j)
    return send


@shortcut("check_pipeline_forward", "stages each micro-batch's output in one buffer it sent",
          ["ran torch's copy_ on the buffer of rank 0's comm.send to rank 1", WAIT])
def forward_reuses_sent_buffer(stage, comm, X, num_microbatches, batch_size, in_shape):
    return _forward(stage, comm, X, num_microbatches, batch_size, in_shape,
                    _one_buffer(comm, wait_first=False))


@shortcut("check_pipeline_forward", "frees each output's memory as soon as it is sent",
          ["ran torch's resize_ on the buffer of rank 0's comm.send to rank 1", WAIT])
def forward_frees_after_send(stage, comm, X, num_microbatches, batch_size, in_shape):
    def send(out, j, rows):
        comm.send(out, comm.rank + 1, tag=j)
        out.resize_(0)                # passed on: no need to keep it, or so it seems
    return _forward(stage, comm, X, num_microbatches, batch_size, in_shape, send)


@shortcut("check_pipeline_forward", "comm.send without comm.wait()",
          ["rank 0's comm.send to rank 1 " + NEVER, "comm.wait()"])
def forward_never_waits(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    outs = []
    with torch.no_grad():
        for j in range(m):
            h = X.tensor_split(m)[j] if r == 0 else comm.recv(r - 1, (rows[j], *in_shape), tag=j)
            outs.append(stage(h))
            if r < p - 1:
                comm.send(outs[-1], r + 1, tag=j)
    return torch.cat(outs) if r == p - 1 else None


@other("check_pipeline_forward", "one staging buffer, the sends waited for before each reuse")
def forward_waits_before_reuse(stage, comm, X, num_microbatches, batch_size, in_shape):
    return _forward(stage, comm, X, num_microbatches, batch_size, in_shape,
                    _one_buffer(comm, wait_first=True))


@other("check_pipeline_forward", "a clone sent, the output kept and read meanwhile")
def forward_sends_a_clone(stage, comm, X, num_microbatches, batch_size, in_shape):
    def send(out, j, rows):
        comm.send(out.clone(), comm.rank + 1, tag=j)
        out.mul_(1.0)
    return _forward(stage, comm, X, num_microbatches, batch_size, in_shape, send)


# ---- ring_forward (context_parallel.ipynb) -----------------------------------------------------
def _ring(q, k, v, comm, step):
    """Ring attention forward; `step(kv, i)` passes the block kv on and returns the next one
    (in the same buffers or new ones); kv starts as the rank's own buffers (copies of k, v)."""
    acc, m, l = helpers.block_attention(q, k, v)
    kv = [k.clone(), v.clone()]
    for i in range(comm.world - 1):
        kv = step(kv, i)
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, *kv))
    comm.wait()
    return acc / l[..., None]


def _ring_send(comm, kv, i):
    r, w = comm.rank, comm.world
    for n, t in enumerate(kv):
        comm.send(t, (r + 1) % w, tag=2 * i + n)
    return [comm.recv((r - 1) % w, t.shape, tag=2 * i + n) for n, t in enumerate(kv)]


@shortcut("check_ring_forward", "receives the next block into the buffers it just sent",
          ["ran torch's copy_ on the buffer of rank", "'s comm.send to rank", WAIT])
def ring_overwrites_sent_block(q, k, v, comm):
    def step(kv, i):
        for t, got in zip(kv, _ring_send(comm, kv, i), strict=True):
            t.copy_(got)
        return kv
    return _ring(q, k, v, comm, step)


@shortcut("check_ring_forward", "isendrecv, the next block copied in before the hop's wait()",
          ["ran torch's copy_ on the buffer of rank", "'s isendrecv send to rank", HOP])
def ring_isendrecv_overwrites_before_wait(q, k, v, comm):
    def step(kv, i):
        r, w = comm.rank, comm.world
        hop = comm.isendrecv([(t, (r + 1) % w, 2 * i + n) for n, t in enumerate(kv)],
                             [((r - 1) % w, t.shape, t.dtype, 2 * i + n)
                              for n, t in enumerate(kv)])
        for t, got in zip(kv, hop.received(), strict=True):
            t.copy_(got)
        hop.wait()
        return kv
    return _ring(q, k, v, comm, step)


@shortcut("check_ring_forward", "sendrecv, the next block copied into the block it sent",
          ["ran torch's copy_ on the buffer of rank", "'s isendrecv send to rank", HOP,
           "after a sendrecv: comm.wait()"])
def ring_sendrecv_overwrites(q, k, v, comm):
    def step(kv, i):
        r, w = comm.rank, comm.world
        for t in kv:
            t.copy_(comm.sendrecv((t, (r + 1) % w), ((r - 1) % w, t.shape)))
        return kv
    return _ring(q, k, v, comm, step)


@other("check_ring_forward", "the same buffers, refilled after comm.wait()")
def ring_refills_after_wait(q, k, v, comm):
    def step(kv, i):
        got = _ring_send(comm, kv, i)
        comm.wait()
        for t, g in zip(kv, got, strict=True):
            t.copy_(g)
        return kv
    return _ring(q, k, v, comm, step)


@other("check_ring_forward", "isendrecv, the next block copied in after the hop's wait()")
def ring_isendrecv_copies_after_wait(q, k, v, comm):
    def step(kv, i):
        r, w = comm.rank, comm.world
        hop = comm.isendrecv([(t, (r + 1) % w, 2 * i + n) for n, t in enumerate(kv)],
                             [((r - 1) % w, t.shape, t.dtype, 2 * i + n)
                              for n, t in enumerate(kv)])
        for t, got in zip(kv, hop.wait(), strict=True):
            t.copy_(got)
        return kv
    return _ring(q, k, v, comm, step)


@other("check_ring_forward", "clones sent, the held block read meanwhile")
def ring_sends_clones(q, k, v, comm):
    def step(kv, i):
        got = _ring_send(comm, [t.clone() for t in kv], i)
        for t, g in zip(kv, got, strict=True):
            t.copy_(g)
        comm.wait()         # the clones in flight until the step's end, as the text asks
        return kv
    return _ring(q, k, v, comm, step)


# ---- tokens_to_heads (context_parallel.ipynb) --------------------------------------------------
@shortcut("check_tokens_to_heads", "one staging buffer reused for every destination",
          ["ran torch's copy_ on the buffer of rank", "comm.send to rank", WAIT])
def heads_one_staging_buffer(x, comm):
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    staged = torch.empty_like(pieces[0])
    for j in range(w):
        if j != r:
            staged.copy_(pieces[j])
            comm.send(staged, j, tag=5)
    got = [pieces[r] if j == r else comm.recv(j, pieces[j].shape, tag=5) for j in range(w)]
    comm.wait()
    return torch.cat(got, dim=2)


@other("check_tokens_to_heads", "one staging buffer, the sends waited for before each reuse")
def heads_staging_waited(x, comm):
    """Step d sends to rank r+d and receives from rank r-d before waiting (waiting for every
    send before any receive deadlocks on processes: tests/test_checks_send_waits.py)."""
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    staged = torch.empty_like(pieces[0])
    got = {r: pieces[r]}
    for d in range(1, w):
        staged.copy_(pieces[(r + d) % w])
        comm.send(staged, (r + d) % w, tag=5)
        got[(r - d) % w] = comm.recv((r - d) % w, pieces[0].shape, tag=5)
        comm.wait()
    return torch.cat([got[j] for j in range(w)], dim=2)


# ---- the World itself ---------------------------------------------------------------------------
def _pass_on(comm, touch):
    """Each rank sends a tensor to the next one and receives from the previous one, touching
    `touch(sent)` before comm.wait()."""
    sent = torch.full((4,), float(comm.rank))
    comm.send(sent, (comm.rank + 1) % comm.world)
    got = comm.recv((comm.rank - 1) % comm.world, (4,))
    touch(sent)
    comm.wait()
    sent.mul_(2)                    # after the wait: the rank's own again
    return got


def test_reading_a_sent_tensor_meanwhile_passes_writing_it_fails():
    assert [t.tolist() for t in World(2).run(_pass_on, lambda s: s.sum())] == [
        [1.0] * 4, [0.0] * 4]
    with pytest.raises(CheckFailed, match=r"ran torch's mul_ on the buffer of rank (0|1)'s "
                                          r"comm.send to rank (1|0) .*" + re.escape(WAIT)):
        World(2).run(_pass_on, lambda s: s[1:].mul_(2))


def test_a_write_caught_by_the_answer_still_fails():
    def caught(sent):
        try:
            sent.zero_()
        except CheckFailed:
            pass
    with pytest.raises(CheckFailed, match="zero_ on the buffer of rank .'s comm.send"):
        World(2).run(_pass_on, caught)


def test_a_thread_world_without_records_keeps_no_sends():
    """launch(threads=True)'s world (record=False): nothing held for a wait, nothing judged."""
    world = ThreadWorld(2, record=False)

    def body(comm):
        out = _pass_on(comm, lambda s: s.mul_(2))
        return out, len(comm._pending)
    assert [(t.tolist(), n) for t, n in world.run(body)] == [([1.0] * 4, 0), ([0.0] * 4, 0)]
    assert world.messages == [] and world.timeline == [[], []]


test_case = parametrize_cases(__name__)
