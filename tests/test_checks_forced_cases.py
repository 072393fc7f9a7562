"""A check's discriminating cases are forced, not drawn: a named wrong answer fails on every
draw, not only on the draws that happen to hold the case that tells it apart (a score large
enough to overflow, a second routing choice, a 4-byte dtype, a max-pool net, two heads per
rank, a memory-bound operation more intense than a compute-bound one, an uneven split where
torch.tensor_split's sizes are not torch.chunk's, a sort of more than 16 equal keys, where
torch's CPU sort stops keeping their order unasked, a length the world size or the device count
divides and one it does not, a bucket of more or fewer tensors than there are ranks, a last
expert or rank that nothing is sent to, a running total exactly the bucket size, a block with
a batched product, two slices of one activation saved alone, big tensors side by side, a
momentum other than 0.5, full recomputation under sequence parallelism). Each check's inputs
stay fresh; only which cases appear is fixed.
"""
import contextlib
import importlib
import pathlib

import pytest
import torch
import torch.distributed as dist
from check_cases import CASES, parametrize_cases, ring_over, shortcut, spread_over
from torch.nn import functional as F
from torch.utils.checkpoint import CheckpointPolicy

import helpers
from helpers.checks._core.inputs import replay_seeds

TESTS = pathlib.Path(__file__).resolve().parent
for path in sorted(TESTS.glob("test_checks_*.py")):
    if path.stem not in ("test_checks_registry", "test_checks_forced_cases"):
        importlib.import_module(path.stem)     # fills CASES with every module's shortcuts

FORCED = ["check_z_loss", "check_permute_tokens", "check_tp_bytes_per_step",
          "check_accumulation_bytes", "check_saved_bytes", "check_tokens_to_heads",
          "check_roofline_time", "check_local_shape", "check_activation_bytes"]
# This module's own shortcuts only, not every module's: a World of thread ranks a draw, or other
# modules' shortcuts that no forced case concerns (five draws of each would cost seconds apiece).
FORCED_HERE = ["check_dispatch_tokens", "check_grad_shard", "check_average_bucket",
               "check_gather_layer", "check_balancing_loss", "check_bucket_params",
               "check_accumulate_zero2", "check_save_matmuls", "check_saved_bytes_of_call",
               "check_zero1_optimizer", "check_update_running_stats", "check_accumulated_step"]
# Their worked answers replayed too: a forced size (one the world size divides, a tensor count
# other than the world size, a split where chunk's sizes are not tensor_split's) must reject no
# right answer.
WORKED_HERE = ["check_grad_shard", "check_average_bucket", "check_accumulated_step",
               "check_zero1_optimizer", "check_accumulate_zero2", "check_save_matmuls"]
# Five replayed draws: each case above is forced into every call, so the draws vary only
# the rest of the inputs; a case the forcing misses is what these tests would catch.
SEEDS = range(5)


@shortcut("check_z_loss", "log-sum-exp without the max shift (exp overflows)", "exp overflowed")
def z_loss_unshifted(logits):
    return (torch.log(torch.exp(logits).sum(-1)) ** 2).mean()


@shortcut("check_permute_tokens", "top-1 routing only", "the choices of each expert")
def permute_top1(x, expert, n_experts):
    first = expert[:, 0]
    order = torch.argsort(first, stable=True)
    return x[order], torch.bincount(first, minlength=n_experts)


@shortcut("check_permute_tokens", "torch.bincount without minlength (no count for an unchosen "
          "last expert)", "the choices of each expert")
def permute_no_minlength(x, expert, n_experts):
    flat = expert.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert.shape[1]], torch.bincount(flat)


@shortcut("check_balancing_loss", "torch.bincount without minlength (no count for an unchosen "
          "last expert)", "raised")
def balancing_no_minlength(probs, expert, n_experts):
    f = torch.bincount(expert.reshape(-1)).float() / expert.numel()
    return n_experts * (f * probs.mean(0)).sum()


@shortcut("check_bucket_params", "a bucket closed above bucket_mb, not at it (size > limit)",
          "at least bucket_mb")
def bucket_params_above(params, bucket_mb):
    limit = None if bucket_mb is None else bucket_mb * 2**20
    buckets, current, size, seen = [], [], 0, set()
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size > limit:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


@shortcut("check_tp_bytes_per_step", "2-byte activations hard-coded", "expected")
def tp_bytes_bf16(blocks, m, tokens, width, tp, dtype_bytes):
    return 4 * blocks * m * 2 * (tp - 1) / tp * tokens * width * 2


@shortcut("check_accumulation_bytes", "2-byte gradients hard-coded", "2-byte gradients")
def accumulation_bytes_bf16(n_params, k, m, acc, dtype_bytes):
    shard = (k - 1) / k * n_params * 2
    return (m if acc == "every" else 1) * shard + shard


@shortcut("check_saved_bytes", "every saved tensor counted as float32", "autograd saved")
def saved_bytes_f32(net, X):
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    seen, sizes = set(), []

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen.add(key)
            sizes.append(t.untyped_storage().nbytes() // t.element_size() * 4)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return sum(sizes)


@shortcut("check_tokens_to_heads", "one head per rank assumed", "bytes")
def heads_one_per_rank(x, comm):
    r, w = comm.rank, comm.world
    for j in range(w):
        if j != r:
            comm.send(x[:, j:j + 1].contiguous(), j, tag=0)
    parts = [x[:, r:r + 1] if j == r else comm.recv(j, (x.shape[0], 1, *x.shape[2:]), tag=0)
             for j in range(w)]
    comm.wait()
    return torch.cat(parts, dim=2)


@shortcut("check_permute_tokens", "an unstable sort (token order within an expert not kept)",
          "a stable sort")
def permute_unstable_sort(x, expert, n_experts):
    flat = expert.reshape(-1)
    order = flat.argsort()
    return x[order // expert.shape[1]], torch.bincount(flat, minlength=n_experts)


@shortcut("check_local_shape", "torch.tensor_split's sizes (the extra rows to the first ranks)",
          "tensor_split")
def local_shape_tensor_split(shape, split_dim, dp, tp, dp_rank):
    s = list(shape)
    if split_dim is not None:
        s[split_dim] //= tp
    s[0] = s[0] // dp + (1 if dp_rank < s[0] % dp else 0)
    return tuple(s)


@shortcut("check_dispatch_tokens", "an unstable sort of dest (row order within a source lost)",
          "a stable sort")
def dispatch_unstable_sort(x, dest, comm):
    w = comm.world
    order = dest.argsort()
    send = torch.bincount(dest, minlength=w)
    recv = comm.all_to_all(send, [1] * w, [1] * w)
    return comm.all_to_all(x[order], send.tolist(), recv.tolist())


@shortcut("check_dispatch_tokens", "torch.bincount without minlength (no count for a last rank "
          "sent nothing)", "raised")
def dispatch_no_minlength(x, dest, comm):
    counts = torch.bincount(dest)
    ones = [1] * comm.world
    incoming = comm.all_to_all(counts, ones, ones)
    return comm.all_to_all(x[torch.argsort(dest, stable=True)], counts.tolist(),
                           incoming.tolist())


@shortcut("check_grad_shard", "padded by world - n % world (a whole block more when it divides)",
          "reduce-scattered")
def grad_shard_overpad(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(world - flat_grad.numel() % world)])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


@shortcut("check_grad_shard", "padded by n % world (what -n % world is on 2 ranks only)",
          "the input must be world")
def grad_shard_pad_mod(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(flat_grad.numel() % world)])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


@shortcut("check_average_bucket", "divided by the number of tensors, not of ranks",
          "not the average over the ranks")
def average_bucket_by_count(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= len(grads)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _chunks_floor_plus_one(data):
    """Each tensor's views in chunks of n // k + 1 elements (a ceiling wrong when k divides n),
    padded with empty views to k chunks."""
    k = len(data)
    size = data[0].numel() // k + 1
    chunks = [list(t.view(-1).split(size)) for t in data]
    return [c + [t.view(-1)[:0]] * (k - len(c)) for c, t in zip(chunks, data, strict=True)]


# Sizes forced one way and the other (one that k divides, others not), judged on one draw each:
# simulated GPUs cost too much for ten.
@shortcut("check_ring_allreduce", "chunks of n // k + 1 (a whole element more when k divides)",
          "one chunk of about n/k")
def ring_allreduce_floor_plus_one(data):
    return ring_over(data, _chunks_floor_plus_one(data))


@shortcut("check_allreduce_spread", "chunks of n // k + 1 (a whole element more when k divides)",
          "spread them")
def allreduce_spread_floor_plus_one(data):
    spread_over(_chunks_floor_plus_one(data))


@shortcut("check_sharded_server_step", "chunks of n // k + 1 (a whole element more when k divides)",
          "more than serving its chunk needs")
def sharded_server_floor_plus_one(params, grads, devices, lr):
    k = len(devices)
    p_chunks, g_chunks = _chunks_floor_plus_one(params), _chunks_floor_plus_one(grads)
    for j in range(k):
        p_chunks[j][j].sub_(lr * sum(g_chunks[i][j].to(devices[j]) for i in range(k)))
    for i in range(k):
        for j in range(k):
            if i != j:
                p_chunks[i][j].copy_(p_chunks[j][j])


@shortcut("check_gather_layer", "the padding kept (split fails when there is some)", "raised")
def gather_layer_padding_kept(shard, shapes):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(full, shard)
    return [p.view(s) for p, s in zip(full.split([s.numel() for s in shapes]), shapes,
                                       strict=True)]


@shortcut("check_gather_layer", "the padding cut by [:-pad] (all of it when pad is 0)", "raised")
def gather_layer_cut_negative(shard, shapes):
    world = dist.get_world_size()
    full = shard.new_empty(shard.numel() * world)
    dist.all_gather_into_tensor(full, shard)
    full = full[:-(-sum(s.numel() for s in shapes) % world)]
    return [p.view(s) for p, s in zip(full.split([s.numel() for s in shapes]), shapes,
                                       strict=True)]


# An optimizer step that shows the gradient's scale (AdamW's first step, about lr * sign(g), hid
# it); a block with every matrix product the policy names; slices saved alone; big tensors side
# by side; a momentum other than 0.5; a split where chunk's sizes are not tensor_split's.
@shortcut("check_accumulate_zero2", "each micro-batch's loss not divided by their number",
          "times the averaged gradient")
def accumulate_zero2_undivided(model, micro_batches):
    for i, (X, y) in enumerate(micro_batches):
        with model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
            F.cross_entropy(model(X), y).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_save_matmuls", "bmm forgotten (MUST_SAVE for mm and addmm only)",
          "ran matrix products again ({'bmm'")
def save_matmuls_no_bmm(ctx, op, *args, **kwargs):
    aten = torch.ops.aten
    if op in (aten.mm.default, aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _view_bytes(f, args, params, key):
    """Each saved tensor's own bytes (numel * element_size), once per `key(t)`: the bytes of a
    view, not of its storage."""
    skip = {key(p) for p in params}
    seen = {}

    def pack(t):
        if key(t) not in skip:
            seen.setdefault(key(t), t.numel() * t.element_size())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*args)
    return sum(seen.values())


def _by_address(t):
    return t.data_ptr()


def _by_storage(t):
    return t.untyped_storage().data_ptr()


@shortcut("check_saved_bytes_of_call", "keyed by t.data_ptr(), each view's bytes",
          "a slice saved alone")
def saved_bytes_of_call_by_address(f, *inputs):
    return _view_bytes(f, inputs, f.parameters(), _by_address)


@shortcut("check_saved_bytes_of_call", "keyed by storage, the first view's bytes",
          "a slice saved alone")
def saved_bytes_of_call_first_view(f, *inputs):
    return _view_bytes(f, inputs, f.parameters(), _by_storage)


# words any hint keeps: the hint is chosen by which wrong count the number equals, and a count
# keyed by address can equal the layers' outputs by chance
@shortcut("check_saved_bytes", "keyed by t.data_ptr(), each view's bytes", "autograd saved")
def saved_bytes_by_address(net, X):
    return _view_bytes(net, (X,), net.parameters(), _by_address)


@shortcut("check_saved_bytes", "keyed by storage, the first view's bytes", "autograd saved")
def saved_bytes_first_view(net, X):
    return _view_bytes(net, (X,), net.parameters(), _by_storage)


@shortcut("check_zero1_optimizer", "contiguous runs by count (tensor_split of the indices)",
          "balance them by size")
def zero1_contiguous(params, rank, world, lr):
    mine = torch.arange(len(params)).tensor_split(world)[rank].tolist()
    return torch.optim.AdamW([params[i] for i in mine], lr=lr)


@shortcut("check_zero1_optimizer", "each parameter in order to the least loaded rank (no "
          "largest-first sort)", "balance them by size")
def zero1_unsorted(params, rank, world, lr):
    load, owners = [0] * world, []
    for p in params:
        owners.append(load.index(min(load)))
        load[owners[-1]] += p.numel()
    return torch.optim.AdamW([p for p, r in zip(params, owners) if r == rank], lr=lr)


@shortcut("check_update_running_stats", "momentum weighing the old value (flipped)",
          "the weight of the NEW batch mean")
def update_running_stats_flipped(running_mean, running_var, mean, var, n, momentum):
    return (momentum * running_mean + (1 - momentum) * mean,
            momentum * running_var + (1 - momentum) * var * n / (n - 1))


@shortcut("check_accumulated_step", "micro-batches by torch.chunk", "torch.chunk's sizes")
def accumulated_step_chunk(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.chunk(num_micro), y.chunk(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]
            p.grad = None


test_case = parametrize_cases(__name__)


@pytest.mark.parametrize("case", [c for name in FORCED for c in CASES[name]["shortcuts"]]
                         + [c for name in FORCED_HERE for c in CASES[name]["shortcuts"]
                            if c.module == __name__], ids=repr)
def test_every_shortcut_fails_on_every_draw(case, monkeypatch):
    """Every registered shortcut of these checks (of the FORCED_HERE ones, this module's), on
    five replayed draws: each one fails."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    for seed in SEEDS:              # conftest replays its own seeds again after the test
        replay_seeds(seed)
        case.judge()


@pytest.mark.parametrize("case", [c for name in WORKED_HERE for c in CASES[name]["worked"]],
                         ids=repr)
def test_worked_answer_passes_on_every_draw(case, monkeypatch):
    """The worked answers of WORKED_HERE's checks pass on the same five replayed draws."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    for seed in SEEDS:
        replay_seeds(seed)
        case.judge()


def test_average_bucket_is_told_apart_on_its_least_favourable_draw(monkeypatch):
    """A draw where both buckets hold as many tensors as there are ranks (about 1 in 36): the
    answer that divides by the number of tensors still fails, on the bucket forced to differ."""
    import helpers.checks.ddp_scratch as module
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    monkeypatch.setattr(module, "randint", lambda g, lo, hi: min(max(lo, 3), hi))  # world 3, 3
    result = helpers.checks.check_average_bucket(average_bucket_by_count)
    assert result.status == "failed", f"dividing by the number of tensors passed: {result}"
    worked = CASES["check_average_bucket"]["worked"][0].fn
    assert helpers.checks.check_average_bucket(worked).status == "passed"
