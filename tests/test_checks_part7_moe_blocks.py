"""The checks of Part VII's exercises on blocks and experts (half block, tokens to heads, z-loss,
permutation, expert gradient groups, accumulation bytes; helpers/checks/ context_parallel.py,
expert_parallel.py, composed.py): the worked answers (the notebooks' solution cells) pass,
shortcuts of two kinds or more fail with the words that name the skipped step, and other right
answers pass (tests/check_cases.py); test_checks_part7.py holds the chapters' other checks."""
import json
import math

import pytest
import torch
from book_files import ROOT
from check_cases import CASES, cases_of, other, shortcut, worked

import helpers
import helpers.checks as new


def solution(notebook, name):
    """The function `name` as the notebook's solution cell defines it."""
    nb = json.loads((ROOT / "book" / "part7" / notebook).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and f"def {name}(" in src:
            space = {"torch": torch, "helpers": helpers, "math": math, "__name__": __name__}
            exec(compile(src, f"{notebook}:{name}", "exec"), space)
            return space[name]
    raise LookupError(f"{notebook} has no solution cell defining {name}")


REFUSED = "the course's own answer"

for check, notebook, name in [
        ("check_half_block", "context_parallel.ipynb", "half_block"),
        ("check_tokens_to_heads", "context_parallel.ipynb", "tokens_to_heads"),
        ("check_z_loss", "expert_parallel.ipynb", "z_loss"),
        ("check_permute_tokens", "expert_parallel.ipynb", "permute_tokens"),
        ("check_expert_grad_group", "expert_parallel.ipynb", "expert_grad_group"),
        ("check_accumulation_bytes", "composed.ipynb", "accumulation_bytes")]:
    worked(check)(solution(notebook, name))


# ---- context_parallel ----------------------------------------------------------------------------
@shortcut("check_half_block", "the whole block, skipping only hidden blocks", "half a block")
def half_whole(q_pos, k_pos):
    return (len(q_pos), 0) if bool(k_pos.min() > q_pos.max()) else (0, len(k_pos))


@shortcut("check_half_block", "the keys each query sees, not all queries'", "leaves out pairs")
def half_first_query(q_pos, k_pos):
    cols = int((k_pos <= q_pos.min()).sum())
    return (0, cols) if cols else (len(q_pos), 0)


@shortcut("check_half_block", "the course's causal_block", REFUSED)
def half_reference(q_pos, k_pos):
    first, cols, _ = helpers.causal_block(q_pos, k_pos)
    return first, cols


@other("check_half_block", "a loop over the pairs")
def half_loop(q_pos, k_pos):
    rows = [i for i, q in enumerate(q_pos.tolist()) if any(k <= q for k in k_pos.tolist())]
    cols = [j for j, k in enumerate(k_pos.tolist()) if any(k <= q for q in q_pos.tolist())]
    return (rows[0], cols[-1] + 1) if rows else (len(q_pos), 0)


@shortcut("check_tokens_to_heads", "an all-gather of everything", "not a collective")
def heads_all_gather(x, comm):
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(comm.world)]
    dist.all_gather(parts, x)
    return torch.cat(parts, 2).chunk(comm.world, 1)[comm.rank]


@shortcut("check_tokens_to_heads", "every head to every rank", "bytes")
def heads_send_all(x, comm):
    w, r = comm.world, comm.rank
    for j in range(w):
        if j != r:
            comm.send(x, j, tag=3)
    got = [x if j == r else comm.recv(j, x.shape, tag=3) for j in range(w)]
    comm.wait()
    return torch.cat(got, 2).chunk(w, 1)[r]


@shortcut("check_tokens_to_heads", "the course's seq_to_heads", REFUSED)
def heads_reference(x, comm):
    return helpers.seq_to_heads(x, comm)


@other("check_tokens_to_heads", "receives first from lower ranks, split with tensor_split")
def heads_by_split(x, comm):
    w, r = comm.world, comm.rank
    pieces = torch.tensor_split(x, w, dim=1)
    for j in sorted(range(w), key=lambda j: (j - r) % w):
        if j != r:
            comm.send(pieces[j], j, tag=11)
    out = torch.cat([pieces[r] if j == r else comm.recv(j, tuple(pieces[j].shape), tag=11)
                     for j in range(w)], dim=2)
    comm.wait()          # after the receives: waiting before them deadlocks on processes
    return out


# ---- expert_parallel -----------------------------------------------------------------------------
@shortcut("check_z_loss", "the log-sum-exp, not squared", "square it")
def z_not_squared(logits):
    return torch.logsumexp(logits, -1).mean()


@shortcut("check_z_loss", "the largest score", "squares the largest score")
def z_max(logits):
    return (logits.amax(-1) ** 2).mean()


@shortcut("check_z_loss", "the course's router_z_loss", REFUSED)
def z_reference(logits):
    return helpers.router_z_loss(logits)


@other("check_z_loss", "the course's own formula, written out: equal code, no copy")
def z_same_formula(logits):
    return (torch.logsumexp(logits.float(), -1) ** 2).mean()


@shortcut("check_z_loss", "the course's router_z_loss, a copy made from its source", REFUSED)
def z_reference_copy(logits):
    import inspect
    space = dict(helpers.router_z_loss.__globals__)
    exec(inspect.getsource(helpers.router_z_loss), space)
    return space["router_z_loss"](logits)


@other("check_z_loss", "by hand, shifted by the max")
def z_by_hand(logits):
    m = logits.amax(-1, keepdim=True)
    lse = (m + (logits - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)
    return (lse * lse).mean()


@shortcut("check_permute_tokens", "the tokens in their own order", "group them by expert")
def permute_none(x, expert, n_experts):
    return x.repeat_interleave(expert.shape[1], 0), torch.bincount(expert.reshape(-1),
                                                                   minlength=n_experts)


@shortcut("check_permute_tokens", "choice-major order within an expert", "not permuted right")
def permute_choice_major(x, expert, n_experts):
    flat = expert.t().reshape(-1)                     # first choices of every token first
    order = torch.argsort(flat, stable=True)
    return x[order % len(x)], torch.bincount(flat, minlength=n_experts)


@shortcut("check_permute_tokens", "the course's permute_by_expert", REFUSED)
def permute_reference(x, expert, n_experts):
    order, counts = helpers.permute_by_expert(expert, n_experts)
    return x[order // expert.shape[1]], counts


@other("check_permute_tokens", "a loop over the experts")
def permute_loop(x, expert, n_experts):
    rows, counts = [], []
    for e in range(n_experts):
        tok = torch.nonzero(expert == e, as_tuple=True)[0]
        rows.append(x[tok])
        counts.append(len(tok))
    return torch.cat(rows), counts


@shortcut("check_expert_grad_group", "the ranks that split the experts", "split the experts")
def group_ep(rank, world, ep):
    return list(range(rank - rank % ep, rank - rank % ep + ep))


@shortcut("check_expert_grad_group", "every rank", "holding the same ones")
def group_all(rank, world, ep):
    return list(range(world))


@other("check_expert_grad_group", "a torch grid's column")
def group_grid(rank, world, ep):
    grid = torch.arange(world).view(world // ep, ep)
    return grid[:, rank % ep]


# ---- composed ------------------------------------------------------------------------------------
@shortcut("check_accumulation_bytes", "one reduction, whatever m", "ignores the micro-batches")
def acc_once(n_params, k, m, acc, dtype_bytes):
    return 2 * (k - 1) / k * n_params * dtype_bytes


@shortcut("check_accumulation_bytes", "m all-reduces", "m all-reduces")
def acc_allreduce(n_params, k, m, acc, dtype_bytes):
    once = (k - 1) / k * n_params * dtype_bytes
    return 2 * m * once if acc == "every" else 2 * once


@shortcut("check_accumulation_bytes", "the course's data_parallel_costs", REFUSED)
def acc_reference(n_params, k, m, acc, dtype_bytes):
    return helpers.data_parallel_costs(n_params, k, "zero2", m, acc, "adam",
                                       dtype_bytes)["sent_bytes"]


@other("check_accumulation_bytes", "counted in passes of the ring, one division")
def acc_chunks(n_params, k, m, acc, dtype_bytes):
    passes = m + 1 if acc == "every" else 2
    return passes * (k - 1) * n_params * dtype_bytes / k


# ---- the harness, for this module's checks --------------------------------------------------
NAMES = ["check_half_block", "check_tokens_to_heads", "check_z_loss", "check_permute_tokens",
         "check_expert_grad_group", "check_accumulation_bytes"]


@pytest.mark.parametrize("case", cases_of(__name__), ids=repr)
def test_case(case, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    result = getattr(new, case.check)(case.fn)
    if case.kind == "shortcut":
        assert result.status == "failed", f"{case}: the shortcut was not rejected: {result}"
        assert case.words in result.message, f"{case}: {case.words!r} not in {result.message!r}"
    else:
        assert result.status == "passed", f"{case}: a right answer was rejected: {result}"


@pytest.mark.parametrize("name", NAMES)
def test_every_check_here_is_declared_and_tested_three_ways(name, monkeypatch):
    from helpers.checks._core import REGISTRY
    assert name in REGISTRY and REGISTRY[name].observes
    cases = CASES[name]
    assert cases["worked"] and cases["others"]
    assert len({c.label for c in cases["shortcuts"]}) >= 2
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)

    def stub(*args, **kwargs):
        raise NotImplementedError()
    assert getattr(new, name)(stub).status == "not done"


def test_only_a_formula_over_torch_may_equal_a_reference():
    """Code equal to a one-statement reference passes the scan only when that statement calls
    nothing of the course: a copy of shard_sequence's one line still runs the course's
    split_positions, so code equal to it stays refused."""
    from helpers.checks._core.bytecode import one_statement
    assert one_statement(helpers.router_z_loss, "helpers")
    assert not one_statement(helpers.shard_sequence, "helpers")
    assert not one_statement(helpers.flat_shard, "helpers")
