"""The Part VII exercise checks (helpers/checks/ context_parallel.py, expert_parallel.py,
composed.py): the worked answers (taken from the
notebooks' solution cells), shortcuts of different kinds with the words of their messages, and
other right answers (tests/check_cases.py)."""
import json
import math

import torch
from book_files import ROOT
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


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


REFUSED = "the course's own answer"     # the harness's words for a reference shortcut

for check, notebook, name in [
        ("check_zigzag_positions", "context_parallel.ipynb", "zigzag_positions"),
        ("check_merge_attention", "context_parallel.ipynb", "merge_attention"),
        ("check_ring_forward", "context_parallel.ipynb", "ring_forward"),
        ("check_balancing_loss", "expert_parallel.ipynb", "balancing_loss"),
        ("check_keep_within_capacity", "expert_parallel.ipynb", "keep_within_capacity"),
        ("check_dispatch_tokens", "expert_parallel.ipynb", "dispatch_tokens"),
        ("check_mesh_groups_3d", "composed.ipynb", "mesh_groups_3d"),
        ("check_activation_bytes", "composed.ipynb", "activation_bytes"),
        ("check_tp_bytes_per_step", "composed.ipynb", "tp_bytes_per_step")]:
    worked(check)(solution(notebook, name))


# ---- context_parallel ----------------------------------------------------------------------------
@shortcut("check_zigzag_positions", "the contiguous split", "contiguous split")
def zigzag_contiguous(T, world, rank):
    return list(range(rank * T // world, (rank + 1) * T // world))


_SHOWN = {0: [0, 1, 14, 15], 1: [2, 3, 12, 13], 2: [4, 5, 10, 11], 3: [6, 7, 8, 9]}


@shortcut("check_zigzag_positions", "the printed example, typed in", "expected")
def zigzag_typed(T, world, rank):
    return _SHOWN[rank % 4]


@shortcut("check_zigzag_positions", "the course's split_positions", REFUSED)
def zigzag_reference(T, world, rank):
    return helpers.split_positions(T, world, rank, "zigzag")


@other("check_zigzag_positions", "chunks of an arange, as a tensor")
def zigzag_chunks(T, world, rank):
    chunks = torch.arange(T).chunk(2 * world)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


@shortcut("check_merge_attention", "exponentiates the raw log-sum-exps", "overflows")
def merge_unshifted(o1, l1, o2, l2):
    a, b = torch.exp(l1), torch.exp(l2)
    return (a[..., None] * o1 + b[..., None] * o2) / (a + b)[..., None], torch.log(a + b)


@shortcut("check_merge_attention", "exponentiates the raw log-sum-exps in float64",
          "overflows")
def merge_unshifted_float64(o1, l1, o2, l2):
    a, b = torch.exp(l1.double()), torch.exp(l2.double())
    o = (a[..., None] * o1.double() + b[..., None] * o2.double()) / (a + b)[..., None]
    return o.to(o1.dtype), torch.log(a + b).to(l1.dtype)


@other("check_merge_attention", "logaddexp, in the inputs' float32")
def merge_logaddexp(o1, l1, o2, l2):
    lse = torch.logaddexp(l1, l2)
    return (torch.exp(l1 - lse)[..., None] * o1 + torch.exp(l2 - lse)[..., None] * o2), lse


@shortcut("check_merge_attention", "averages the two outputs", "not attention over both blocks")
def merge_average(o1, l1, o2, l2):
    return (o1 + o2) / 2, torch.logaddexp(l1, l2)


@shortcut("check_merge_attention", "the course's merge_blocks", REFUSED)
def merge_reference(o1, l1, o2, l2):
    one = torch.ones_like(l1)
    acc, m, l = helpers.merge_blocks(o1, l1, one, o2, l2, one)
    return acc / l[..., None], m + torch.log(l)


@other("check_merge_attention", "running maximum and sum")
def merge_with_max(o1, l1, o2, l2):
    m = torch.maximum(l1, l2)
    a, b = torch.exp(l1 - m), torch.exp(l2 - m)
    return (a[..., None] * o1 + b[..., None] * o2) / (a + b)[..., None], m + torch.log(a + b)


@shortcut("check_ring_forward", "no communication", "sent nothing")
def ring_local(q, k, v, comm):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return s.softmax(-1) @ v


@shortcut("check_ring_forward", "every block to every rank", "sends only to the next one")
def ring_gather_all(q, k, v, comm):
    r, w = comm.rank, comm.world
    for j in range(w):
        if j != r:
            comm.send(torch.stack([k, v]), j, tag=1)
    kvs = [torch.stack([k, v]) if j == r else comm.recv(j, (2, *k.shape), tag=1)
           for j in range(w)]
    K, V = torch.cat([kv[0] for kv in kvs], 2), torch.cat([kv[1] for kv in kvs], 2)
    comm.wait()
    return (q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ V


@shortcut("check_ring_forward", "the course's ring_attention", REFUSED)
def ring_reference(q, k, v, comm):
    return helpers.ring_attention(q, k, v, comm, causal=False, layout="contiguous")


@other("check_ring_forward", "K and V in one message per step")
def ring_one_message(q, k, v, comm):
    r, w = comm.rank, comm.world
    acc, m, l = helpers.block_attention(q, k, v)
    kv = torch.stack([k, v])
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)
        comm.wait()
        acc, m, l = helpers.merge_blocks(acc, m, l, *helpers.block_attention(q, kv[0], kv[1]))
    return acc / l[..., None]


# ---- expert_parallel -----------------------------------------------------------------------------
@shortcut("check_balancing_loss", "counts first choices only", "only the first choices")
def balancing_first_only(probs, expert, n_experts):
    f = torch.bincount(expert[:, 0], minlength=n_experts).float() / len(expert)
    return n_experts * (f * probs.mean(0)).sum()


@shortcut("check_balancing_loss", "probabilities only", "expected")
def balancing_probs_only(probs, expert, n_experts):
    return n_experts * (probs.mean(0) ** 2).sum()


@other("check_balancing_loss", "one-hot mean")
def balancing_one_hot(probs, expert, n_experts):
    f = torch.nn.functional.one_hot(expert, n_experts).float().mean((0, 1))
    return n_experts * (f * probs.mean(0)).sum()


@shortcut("check_keep_within_capacity", "no capacity", "with capacity")
def keep_everything(expert, capacity, n_experts):
    return torch.ones(expert.shape, dtype=torch.bool)


@shortcut("check_keep_within_capacity", "token-major order", "every first choice")
def keep_token_major(expert, capacity, n_experts):
    used, kept = [0] * n_experts, torch.zeros(expert.shape, dtype=torch.bool)
    for i in range(expert.shape[0]):
        for j in range(expert.shape[1]):
            if used[int(expert[i, j])] < capacity:
                used[int(expert[i, j])] += 1
                kept[i, j] = True
    return kept


@other("check_keep_within_capacity", "vectorised cumulative count")
def keep_cumsum(expert, capacity, n_experts):
    one_hot = torch.nn.functional.one_hot(expert.t().reshape(-1), n_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).view(expert.shape[1], -1).t()
    return slot < capacity


@shortcut("check_dispatch_tokens", "everything to everyone", "send each row only to")
def dispatch_broadcast(x, dest, comm):
    w = comm.world
    n = comm.all_to_all(torch.tensor([len(x)] * w), [1] * w, [1] * w)
    rows = comm.all_to_all(x.repeat(w, 1), [len(x)] * w, n.tolist())
    keep = comm.all_to_all(dest.repeat(w), [len(x)] * w, n.tolist())
    return rows[keep == comm.rank]


@shortcut("check_dispatch_tokens", "no exchange", "sent 0 bytes")
def dispatch_stay(x, dest, comm):
    return x[dest == comm.rank]


@shortcut("check_dispatch_tokens", "its own counts as out_splits: the counts never exchanged",
          ["out_splits[j] must be the number of rows rank j sends you", "Exchange the counts"])
def dispatch_own_counts(x, dest, comm):
    counts = torch.bincount(dest, minlength=comm.world).tolist()
    return comm.all_to_all(x[torch.argsort(dest, stable=True)], counts, counts)


@shortcut("check_dispatch_tokens", "the counts exchanged, then its own passed as out_splits",
          "out_splits[j] must be the number of rows rank j sends you")
def dispatch_counts_unused(x, dest, comm):
    counts = torch.bincount(dest, minlength=comm.world)
    comm.all_to_all(counts, [1] * comm.world, [1] * comm.world)
    return comm.all_to_all(x[torch.argsort(dest, stable=True)], counts.tolist(), counts.tolist())


@other("check_dispatch_tokens", "send and recv by hand")
def dispatch_by_hand(x, dest, comm):
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
    comm.wait()
    return torch.cat(got)


# ---- composed ------------------------------------------------------------------------------------
_GRID = {0: dict(pp=[0, 4], dp=[0, 2], tp=[0, 1]), 1: dict(pp=[1, 5], dp=[1, 3], tp=[0, 1]),
         2: dict(pp=[2, 6], dp=[0, 2], tp=[2, 3]), 3: dict(pp=[3, 7], dp=[1, 3], tp=[2, 3]),
         4: dict(pp=[0, 4], dp=[4, 6], tp=[4, 5]), 5: dict(pp=[1, 5], dp=[5, 7], tp=[4, 5]),
         6: dict(pp=[2, 6], dp=[4, 6], tp=[6, 7]), 7: dict(pp=[3, 7], dp=[5, 7], tp=[6, 7])}


@shortcut("check_mesh_groups_3d", "the 2x2x2 mesh, typed in", "expected")
def groups_typed(rank, shape):
    return _GRID[rank % 8]


@shortcut("check_mesh_groups_3d", "the first dimension fastest", "group is")
def groups_column_major(rank, shape):
    pp, dp, tp = shape
    t, rest = divmod(rank, pp * dp)
    d, p = divmod(rest, pp)
    at = lambda i, j, k: i + pp * (j + dp * k)
    return dict(pp=[at(i, d, t) for i in range(pp)], dp=[at(p, j, t) for j in range(dp)],
                tp=[at(p, d, k) for k in range(tp)])


@other("check_mesh_groups_3d", "indexing a torch grid")
def groups_with_torch(rank, shape):
    grid = torch.arange(math.prod(shape)).view(shape)
    p, d, t = (int(i) for i in (grid == rank).nonzero()[0])
    return dict(pp=grid[:, d, t].tolist(), dp=grid[p, :, t].tolist(), tp=grid[p, d, :].tolist())


@shortcut("check_activation_bytes", "ignores tensor parallelism", "expected")
def activation_no_tp(width, heads, seq, tp, sp, recompute):
    return width * (34 + 5 * heads * seq / width)


@shortcut("check_activation_bytes", "splits the replicated part too", "sp=False")
def activation_all_split(width, heads, seq, tp, sp, recompute):
    if recompute == "full":
        return 2 * width / tp
    attn = 0 if recompute == "selective" else 5 * heads * seq / width
    return width * (34 + attn) / tp


@shortcut("check_activation_bytes", "full recomputation keeps the whole input under sp",
          ["sp=True, 'full'", "expected"])
def activation_full_unsplit(width, heads, seq, tp, sp, recompute):
    if recompute == "full":
        return 2 * width
    return activation_terms(width, heads, seq, tp, sp, recompute)


@shortcut("check_activation_bytes", "the course's function", REFUSED)
def activation_reference(width, heads, seq, tp, sp, recompute):
    return helpers.activation_bytes_per_token(width, heads, seq, tp, sp, recompute, 2,
                                              flash=False, dropout=True, ln_stats=False)


@other("check_activation_bytes", "term by term (attention, MLP, norms)")
def activation_terms(width, heads, seq, tp, sp, recompute):
    h, t = width, tp
    if recompute == "full":
        return 2 * h / t if sp else 2 * h
    rep = 2 * h + 1 * h + 2 * h + 1 * h + 4 * h       # qkv in, mask, MLP in, mask, norms
    split = 4 * h + 2 * h + 2 * h + 8 * h + 8 * h     # q k, v, proj in, GELU in, out
    if recompute == "none":
        split += 5 * heads * seq                       # softmax, its mask, dropout out
    return (rep / t if sp else rep) + split / t


@shortcut("check_tp_bytes_per_step", "forward only", ["expected", "forward only"])
def tp_bytes_forward(blocks, m, tokens, width, tp, dtype_bytes):
    return 2 * blocks * m * helpers.ring_bytes_per_device(tokens * width * dtype_bytes, tp)


@shortcut("check_tp_bytes_per_step", "the payload, not the ring's volume", "expected")
def tp_bytes_payload(blocks, m, tokens, width, tp, dtype_bytes):
    return 4 * blocks * m * tokens * width * dtype_bytes


@shortcut("check_tp_bytes_per_step", "each ring all-reduce counted as (tp-1)/tp",
          ["forward only", "reduce-scatter then an all-gather"])
def tp_bytes_one_ring_phase(blocks, m, tokens, width, tp, dtype_bytes):
    return 4 * blocks * m * (tp - 1) / tp * tokens * width * dtype_bytes


@shortcut("check_tp_bytes_per_step", "the micro-batches left out", "micro-batches left out")
def tp_bytes_no_micro_batches(blocks, m, tokens, width, tp, dtype_bytes):
    return 4 * blocks * helpers.ring_bytes_per_device(tokens * width * dtype_bytes, tp)


@other("check_tp_bytes_per_step", "closed form")
def tp_bytes_closed(blocks, m, tokens, width, tp, dtype_bytes):
    return 8 * blocks * m * tokens * width * dtype_bytes * (tp - 1) / tp


test_case = parametrize_cases(__name__)
