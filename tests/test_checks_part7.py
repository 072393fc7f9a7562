"""The checks of Part VII's exercises (helpers/checks/part7.py). For each: the worked answer,
taken from the notebook's solution cell, passes; a stub reports "not done"; two shortcuts of
different kinds fail with the check's message; another right answer passes too."""
import json
import math

import pytest
import torch

import helpers
from book_files import ROOT
from helpers.checks import (check_activation_bytes, check_balancing_loss, check_dispatch_tokens,
                            check_keep_within_capacity, check_merge_attention,
                            check_mesh_groups_3d, check_ring_forward, check_tp_bytes_per_step,
                            check_zigzag_positions)


def solution(notebook, name):
    """The function `name` as the notebook's solution cell defines it."""
    nb = json.loads((ROOT / "book" / "part7" / notebook).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and f"def {name}(" in src:
            space = {"torch": torch, "helpers": helpers, "math": math}
            exec(src, space)
            return space[name]
    raise LookupError(f"{notebook} has no solution cell defining {name}")


def stub(*args):
    raise NotImplementedError()


def status(result):
    return result.status, result.message


def failed_with(result, text):
    return result.status == "failed" and text in result.message


# --- context parallelism ----------------------------------------------------------------------
def test_zigzag_positions():
    assert check_zigzag_positions(solution("context_parallel.ipynb", "zigzag_positions"))
    assert check_zigzag_positions(stub).status == "not done"
    contiguous = lambda T, w, r: list(range(r * T // w, (r + 1) * T // w))      # noqa: E731
    assert failed_with(check_zigzag_positions(contiguous), "contiguous split")
    shown = {r: helpers.split_positions(16, 4, r).tolist() for r in range(4)}   # the example
    assert failed_with(check_zigzag_positions(lambda T, w, r: shown[r % 4]), "expected")
    other = lambda T, w, r: helpers.split_positions(T, w, r, "zigzag")          # noqa: E731
    assert check_zigzag_positions(other)


def test_merge_attention():
    assert check_merge_attention(solution("context_parallel.ipynb", "merge_attention"))
    assert check_merge_attention(stub).status == "not done"

    def naive(o1, l1, o2, l2):          # exp() of the raw log-sum-exps: overflows
        a, b = torch.exp(l1), torch.exp(l2)
        return (a[..., None] * o1 + b[..., None] * o2) / (a + b)[..., None], torch.log(a + b)
    assert failed_with(check_merge_attention(naive), "overflows")

    def average(o1, l1, o2, l2):        # ignores how much each block weighs
        return (o1 + o2) / 2, torch.logaddexp(l1, l2)
    assert failed_with(check_merge_attention(average), "not attention over both blocks")

    def with_max(o1, l1, o2, l2):       # the running-max form
        m = torch.maximum(l1, l2)
        a, b = torch.exp(l1 - m), torch.exp(l2 - m)
        return (a[..., None] * o1 + b[..., None] * o2) / (a + b)[..., None], m + torch.log(a + b)
    assert check_merge_attention(with_max)


def gather_all(q, k, v, comm):
    """Shortcut: every rank sends its keys and values to every other rank."""
    r, w = comm.rank, comm.world
    for j in range(w):
        if j != r:
            comm.send(torch.cat([k, v]), j, tag=1)
    parts = [torch.cat([k, v]) if j == r else comm.recv(j, (2 * k.shape[0], *k.shape[1:]), tag=1)
             for j in range(w)]
    ks, vs = zip(*[p.chunk(2) for p in parts])
    return helpers.attention_reference(q, torch.cat(ks, 2), torch.cat(vs, 2))


def test_ring_forward():
    assert check_ring_forward(solution("context_parallel.ipynb", "ring_forward"))
    assert check_ring_forward(stub).status == "not done"
    local = lambda q, k, v, comm: helpers.attention_reference(q, k, v)          # noqa: E731
    assert failed_with(check_ring_forward(local), "sent nothing")
    assert failed_with(check_ring_forward(gather_all), "sends only to the next one")

    def one_message(q, k, v, comm):     # K and V in one tensor per step, and the library ring
        r, w = comm.rank, comm.world
        acc, m, l = helpers.block_attention(q, k, v)
        kv = torch.stack([k, v])
        for i in range(w - 1):
            comm.send(kv, (r + 1) % w, tag=i)
            kv = comm.recv((r - 1) % w, kv.shape, tag=i)
            acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, *kv))
        return acc / l[..., None]
    assert check_ring_forward(one_message)


# --- expert parallelism -----------------------------------------------------------------------
def test_balancing_loss():
    assert check_balancing_loss(solution("expert_parallel.ipynb", "balancing_loss"))
    assert check_balancing_loss(stub).status == "not done"
    first_only = lambda p, e, n: helpers.load_balancing_loss(p, e[:, :1], n)    # noqa: E731
    assert failed_with(check_balancing_loss(first_only), "only the first choices")
    probs_only = lambda p, e, n: n * (p.mean(0) ** 2).sum()                     # noqa: E731
    assert failed_with(check_balancing_loss(probs_only), "expected")

    def one_hot(p, e, n):
        f = torch.nn.functional.one_hot(e, n).float().mean((0, 1))
        return n * (f * p.mean(0)).sum()
    assert check_balancing_loss(one_hot)


def test_keep_within_capacity():
    assert check_keep_within_capacity(solution("expert_parallel.ipynb", "keep_within_capacity"))
    assert check_keep_within_capacity(stub).status == "not done"
    keep_all = lambda e, c, n: torch.ones(e.shape, dtype=torch.bool)            # noqa: E731
    assert failed_with(check_keep_within_capacity(keep_all), "with capacity")

    def token_major(e, c, n):           # token 0's second choice before token 1's first
        used, kept = [0] * n, torch.zeros(e.shape, dtype=torch.bool)
        for i in range(e.shape[0]):
            for j in range(e.shape[1]):
                if used[int(e[i, j])] < c:
                    used[int(e[i, j])] += 1
                    kept[i, j] = True
        return kept
    assert failed_with(check_keep_within_capacity(token_major), "every first choice")
    assert check_keep_within_capacity(_cumsum_keep)


def _cumsum_keep(e, c, n):
    """Another right answer, vectorised: positions from a cumulative count, choice-major."""
    one_hot = torch.nn.functional.one_hot(e.t().reshape(-1), n)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).view(e.shape[1], -1).t()
    return slot < c


def test_dispatch_tokens():
    assert check_dispatch_tokens(solution("expert_parallel.ipynb", "dispatch_tokens"))
    assert check_dispatch_tokens(stub).status == "not done"

    def broadcast(x, dest, comm):       # everything to everyone, filtered on arrival
        n = torch.tensor([len(x)])
        counts = helpers.all_to_all(comm, n.repeat(comm.world), [1] * comm.world,
                                    [1] * comm.world)
        rows = helpers.all_to_all(comm, x.repeat(comm.world, 1), [len(x)] * comm.world,
                                  counts.tolist())
        keep = helpers.all_to_all(comm, dest.repeat(comm.world), [len(x)] * comm.world,
                                  counts.tolist())
        return rows[keep == comm.rank]
    assert failed_with(check_dispatch_tokens(broadcast), "send each row only to")
    stay = lambda x, dest, comm: x[dest == comm.rank]                           # noqa: E731
    assert failed_with(check_dispatch_tokens(stay), "sent 0 bytes")

    def by_hand(x, dest, comm):         # send/recv instead of the all-to-all
        w, r = comm.world, comm.rank
        for j in range(w):
            if j != r:
                comm.send(torch.tensor([int((dest == j).sum())]), j, tag=7)
                comm.send(x[dest == j], j, tag=8)
        got = []
        for j in range(w):
            if j == r:
                got.append(x[dest == r])
                continue
            n = int(comm.recv(j, (1,), tag=7, dtype=torch.int64))
            got.append(comm.recv(j, (n, x.shape[1]), tag=8))
        return torch.cat(got)
    assert check_dispatch_tokens(by_hand)


# --- 3-D layouts ------------------------------------------------------------------------------
def test_mesh_groups_3d():
    assert check_mesh_groups_3d(solution("composed.ipynb", "mesh_groups_3d"))
    assert check_mesh_groups_3d(stub).status == "not done"
    shown = {r: {k: next(g for g in v if r in g) for k, v in
                 helpers.rank_grid((2, 2, 2)).items()} for r in range(8)}
    assert failed_with(check_mesh_groups_3d(lambda r, s: shown[r % 8]), "expected")

    def column_major(rank, shape):      # the first dimension varying fastest
        pp, dp, tp = shape
        t, rest = divmod(rank, pp * dp)
        d, p = divmod(rest, pp)
        at = lambda i, j, k: i + pp * (j + dp * k)                              # noqa: E731
        return dict(pp=[at(i, d, t) for i in range(pp)], dp=[at(p, j, t) for j in range(dp)],
                    tp=[at(p, d, k) for k in range(tp)])
    assert failed_with(check_mesh_groups_3d(column_major), "group is")

    def with_torch(rank, shape):
        grid = torch.arange(math.prod(shape)).view(shape)
        p, d, t = (int(i) for i in (grid == rank).nonzero()[0])
        return dict(pp=grid[:, d, t].tolist(), dp=grid[p, :, t].tolist(),
                    tp=grid[p, d, :].tolist())
    assert check_mesh_groups_3d(with_torch)


def test_activation_bytes():
    assert check_activation_bytes(solution("composed.ipynb", "activation_bytes"))
    assert check_activation_bytes(stub).status == "not done"
    no_tp = lambda h, a, s, t, sp, rec: h * (34 + 5 * a * s / h)                # noqa: E731
    assert failed_with(check_activation_bytes(no_tp), "expected")
    all_split = lambda h, a, s, t, sp, rec: h * (34 + 5 * a * s / h) / t        # noqa: E731
    assert failed_with(check_activation_bytes(all_split), "sp=False")
    lib = lambda h, a, s, t, sp, rec: helpers.activation_bytes_per_token(       # noqa: E731
        h, a, s, t, sp, rec, dtype_bytes=2, flash=False, dropout=True, ln_stats=False)
    assert check_activation_bytes(lib)


def test_tp_bytes_per_step():
    assert check_tp_bytes_per_step(solution("composed.ipynb", "tp_bytes_per_step"))
    assert check_tp_bytes_per_step(stub).status == "not done"
    forward_only = lambda L, m, n, h, t, b: 2 * L * m * helpers.ring_allreduce_bytes(  # noqa
        n * h * b, t)
    assert failed_with(check_tp_bytes_per_step(forward_only), "expected")
    payload = lambda L, m, n, h, t, b: 4 * L * m * n * h * b                    # noqa: E731
    assert failed_with(check_tp_bytes_per_step(payload), "expected")
    closed = lambda L, m, n, h, t, b: 8 * L * m * n * h * b * (t - 1) / t       # noqa: E731
    assert check_tp_bytes_per_step(closed)


@pytest.mark.parametrize("check", [check_zigzag_positions, check_ring_forward,
                                   check_dispatch_tokens])
def test_a_crash_is_reported_not_raised(check):
    def crash(*args):
        raise RuntimeError("boom")
    got = check(crash)
    assert got.status == "failed" and "boom" in got.message
