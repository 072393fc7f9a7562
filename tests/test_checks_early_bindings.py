"""Shortcuts that reach the course's answer or do hidden work through something made before the
check ran fail: a reference bound early (in a deque, an object's attribute, a rank's deque,
torch's DistributedSampler.__iter__) is stubbed all the same, its code put back fails, a worker
thread started before the check refuses the answer; public helpers that compute the exercise are
blocked; a decoy collective or no collective fails. Right answers written differently pass
(references.py, stubs.py, early_threads.py)."""
import collections
import decimal
import queue
import threading
import types

import pytest
import torch
import torch.distributed as dist
from check_cases import dp_group, other, parametrize_cases, shortcut
from torch.utils.data.distributed import DistributedSampler

import helpers
import helpers.checks
from helpers.checks._core.references import Reference, blocked
from helpers.checks._core.run import ReferenceUsed

USED = "the course's own answer"
_DQ = collections.deque([helpers.held_bytes])           # bound at import, before any check
_RANKS = collections.deque([dict(rs=helpers.reduce_scatter_flat)])
_SAMPLER = collections.deque([DistributedSampler, DistributedSampler.__iter__])
_HELD_CODE = helpers.held_bytes.__code__


def _unscanned(name):
    """The module global `name`, looked up by a string at run time: the scan before the answer
    runs walks every object it can name, so these early bindings stay for the later guards."""
    return globals()[name]


class _Holder:
    pass


_HOLDER = _Holder()
_HOLDER.f = helpers.held_bytes


@shortcut("check_tensor_bytes", "the course's function bound early in a deque", USED)
def tensor_bytes_from_deque(tensors):
    return _unscanned("_DQ")[0](tensors)


@shortcut("check_tensor_bytes", "the course's function bound early in an attribute", USED)
def tensor_bytes_from_attribute(tensors):
    return _HOLDER.f(tensors)


@shortcut("check_tensor_bytes", "the course's code put back into its function",
          "rewrote the code")
def tensor_bytes_code_restored(tensors):
    fn = _unscanned("_DQ")[0]
    fn.__code__ = _HELD_CODE
    return fn(tensors)


@shortcut("check_grad_shard", "the course's reduce-scatter bound early, in each rank", USED)
def grad_shard_from_deque(flat_grad):
    w = dist.get_world_size()
    full = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % w)])
    out = full.new_empty(full.numel() // w)
    _unscanned("_RANKS")[0]["rs"](out, full).wait()
    return out / w


@shortcut("check_sampler_shard", "torch's DistributedSampler.__iter__ bound early",
          "DistributedSampler.__iter__")
def sampler_from_early_iter(n, rank, world, epoch, seed):
    s = _unscanned("_SAMPLER")[0](range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    s.set_epoch(epoch)
    return list(_unscanned("_SAMPLER")[1](s))


# --- public helpers that compute the exercise ---------------------------------------------------
@shortcut("check_saved_bytes_of_call", "the course's saved_bytes", USED)
def saved_bytes_of_call_by_course(f, *inputs):
    return helpers.saved_tensor_bytes(f, *inputs)[0]


@shortcut("check_saved_bytes_of_call", "the course's saved_bytes, parameters passed", USED)
def saved_bytes_of_call_by_course2(f, *inputs):
    return helpers.saved_tensor_bytes(lambda: f(*inputs), params=list(f.parameters()))[0]


def _sent(log, k, size):
    return [int(log.sent_by(i)) // size for i in range(k)]


@shortcut("check_ring_allreduce", "the course's ring_all_reduce", USED)
def ring_allreduce_by_course_ring(data):
    if len(data) == 1:
        return [0]
    log = helpers.ByteLog()
    out = helpers.ring.ring_all_reduce([t.reshape(-1) for t in data], [t.device for t in data],
                                       log)
    for t, o in zip(data, out):
        t.copy_(o.reshape(t.shape))
    return _sent(log, len(data), data[0].element_size())


@shortcut("check_ring_allreduce", "the course's ring halves", USED)
def ring_allreduce_by_course_halves(data):
    if len(data) == 1:
        return [0]
    log, devices = helpers.ByteLog(), [t.device for t in data]
    chunks = helpers.ring_reduce_scatter([t.reshape(-1) for t in data], devices, log)
    chunks = helpers.ring_all_gather(chunks, devices, log)
    for t, c in zip(data, chunks):
        t.copy_(torch.cat(c).reshape(t.shape))
    return _sent(log, len(data), data[0].element_size())


@shortcut("check_bytes_sent_naive_vs_ring", "the course's ring halves, counted", USED)
def bytes_sent_by_course_halves(nbytes, k):
    xs = [torch.zeros(nbytes // 4) for _ in range(k)]
    log, cpu = helpers.ByteLog(), [torch.device("cpu")] * k
    helpers.ring_all_gather(helpers.ring_reduce_scatter(xs, cpu, log), cpu, log)
    return (k - 1) * nbytes, log.sent_by(0)


@shortcut("check_mesh_groups", "the course's rank_grid and coords_of", USED)
def mesh_groups_by_rank_grid(rank, dp, tp):
    grid = helpers.rank_grid((dp, tp), ("dp", "tp"))
    c = helpers.coords_of(rank, (dp, tp), ("dp", "tp"))
    return dict(coords=(c["dp"], c["tp"]), tp_group=next(g for g in grid["tp"] if rank in g),
                dp_group=next(g for g in grid["dp"] if rank in g))


@shortcut("check_dp_average", "a decoy one-number all_reduce, the gradients all-gathered",
          "all_gather")
def dp_average_by_all_gather(grads, comm):
    w = dist.get_world_size()
    dist.all_reduce(torch.zeros(1))
    for g in grads:
        parts = [torch.empty_like(g) for _ in range(w)]
        dist.all_gather(parts, g)
        g.copy_(torch.stack(parts).mean(0))


# --- right answers written differently ----------------------------------------------------------
@other("check_shard_sizes")
def shard_sizes_by_comparison(n, k):
    return [n // k + (i < n % k) for i in range(k)]


@other("check_mesh_groups")
def mesh_groups_by_ranges(rank, dp, tp):
    i, j = divmod(rank, tp)
    return dict(coords=(i, j), tp_group=list(range(i * tp, i * tp + tp)),
                dp_group=list(range(j, dp * tp, tp)))


@other("check_z_loss")
def z_loss_shifted(logits):
    m = logits.max(dim=-1, keepdim=True).values
    lse = m.squeeze(-1) + (logits - m).exp().sum(-1).log()
    return (lse * lse).mean()


@other("check_dp_average")
def dp_average_one_flat_bucket(grads, comm):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group(comm))
    flat /= comm.world
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


@other("check_sampler_shard")
def sampler_by_hand(n, rank, world_size, epoch, seed):
    gen = torch.Generator()
    gen.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=gen).tolist()
    per = -(-n // world_size)
    total = per * world_size
    while len(perm) < total:
        perm += perm[:total - len(perm)]
    return perm[rank:total:world_size]


@other("check_strip_module_prefix")
def strip_by_slicing(state_dict):
    return {(key[len("module."):] if key.startswith("module.") else key): value
            for key, value in state_dict.items()}


@other("check_tensor_bytes")
def tensor_bytes_by_itemsize(tensors):
    return sum(t.numel() * t.dtype.itemsize for t in tensors)


@other("check_weight_grads")
def weight_grads_einsum(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy2.T @ x2, dy2.sum(0)


@other("check_matmul_flops")
def matmul_flops_decimal(n):
    return decimal.Decimal(2) * decimal.Decimal(n) ** 3


@other("check_clip_sharded")
def clip_sharded_float64(shards, max_norm):
    sq = torch.stack([p.grad.double().pow(2).sum() for p in shards]  # a rank may own none
                     or [torch.zeros((), dtype=torch.float64)]).sum().reshape(1)
    dist.all_reduce(sq)
    total = sq.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in shards:
        p.grad.mul_(coef.to(p.grad.dtype))
    return float(total)


@other("check_unused_parameters")
def unused_by_graph_walk_iterative(model, loss):
    seen, stack, reached = set(), [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if var is not None:
            reached.add(id(var))
        stack.extend(f for f, _ in node.next_functions)
    return sorted(n for n, p in model.named_parameters() if id(p) not in reached)


test_case = parametrize_cases(__name__)


# --- a worker thread started before the check ---------------------------------------------------
class _Worker:
    """A thread started before the check, running what the answer hands it."""

    def __init__(self):
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while (job := self.jobs.get()) is not None:
            fn, box, done = job
            try:
                box.append(fn())
            except BaseException as e:   # handed back to the answer
                box.append(e)
            done.set()

    def ask(self, fn):
        box, done = [], threading.Event()
        self.jobs.put((fn, box, done))
        done.wait()
        return box[0]

    def stop(self):
        self.jobs.put(None)
        self.thread.join()


@pytest.fixture
def worker():
    w = _Worker()
    yield w
    w.stop()


HIDDEN = "a thread started before the check ran"


def _failed(check, fn, words):
    result = getattr(helpers.checks, check)(fn)
    assert result.status == "failed", result
    assert words in result.message, result.message


def test_work_in_an_early_thread_fails(worker):
    _failed("check_shard_sizes", lambda n, k: worker.ask(
        lambda: [len(s) for s in torch.arange(n).tensor_split(k)]), HIDDEN)
    _failed("check_dp_shard_sizes", lambda b, k: worker.ask(
        lambda: [len(c) for c in torch.arange(b).chunk(k)]), HIDDEN)
    _failed("check_tensor_bytes", lambda tensors: worker.ask(
        lambda: _unscanned("_DQ")[0](tensors)), HIDDEN)


def test_ranks_meeting_in_an_early_thread_fail(worker):
    posted, calls, lock = collections.defaultdict(dict), collections.Counter(), threading.Lock()

    def clip_through_thread(shards, max_norm):
        dist.all_reduce(torch.zeros(1))              # a decoy of the asked collective
        rank, world = dist.get_rank(), dist.get_world_size()
        with lock:                                   # each rank's gradients, not its numbers
            key = (world, calls[rank])
            calls[rank] += 1
            posted[key][rank] = [p.grad.clone() for p in shards]
        for _ in range(10 ** 6):                     # the other ranks' posts (bounded)
            if len(posted[key]) == world:
                break
        total = worker.ask(lambda: sum(float((g ** 2).sum()) for gs in posted[key].values()
                                       for g in gs) ** 0.5)
        for p in shards:
            p.grad.mul_(min(1.0, max_norm / (total + 1e-6)))
        return total
    _failed("check_clip_sharded", clip_through_thread, HIDDEN)


def test_no_collective_fails():
    _failed("check_clip_sharded", lambda shards, max_norm: torch.cat(   # a rank may own none
        [p.grad.flatten() for p in shards] or [torch.zeros(0)]).norm().item(),
        "the norm of its own shards")


def test_stubs_are_taken_off_and_shared_blocks_nest():
    ref = Reference("held_bytes", helpers.held_bytes)
    code = helpers.held_bytes.__code__
    with blocked([ref], "a"):
        with blocked([ref, Reference("ring_all_gather", helpers.ring_all_gather)], "b"):
            assert helpers.held_bytes.__code__ is not code
        assert helpers.held_bytes.__code__ is not code
    assert helpers.held_bytes.__code__ is code
    assert helpers.held_bytes([torch.zeros(3)]) == 12


def _plain(tensors):
    return -1


def test_a_reference_bound_or_written_after_a_check_is_stubbed_in_the_next():
    """The walk of the course's modules kept between checks (bindings.py) sees a name rebound
    (a same-sized namespace) to a renamed copy of the reference, and a course function given
    the reference's code, after the walk was kept: the next check stubs both."""
    ref = Reference("held_bytes", helpers.held_bytes)
    decoy = types.FunctionType(_plain.__code__, {}, "decoy")
    rewritten = types.FunctionType(_plain.__code__, helpers.held_bytes.__globals__, "rewritten")
    helpers._early_probe, helpers._early_rewritten = decoy, rewritten
    try:
        with blocked([ref], "a"):
            assert helpers._early_probe([torch.zeros(3)]) == -1     # kept: not the reference
        helpers._early_probe = types.FunctionType(
            helpers.held_bytes.__code__, helpers.held_bytes.__globals__, "renamed")
        with pytest.raises(ReferenceUsed):
            with blocked([ref], "a"):
                helpers._early_probe([torch.zeros(3)])
        rewritten.__code__ = helpers.held_bytes.__code__       # no name rebound this time
        with pytest.raises(ReferenceUsed):
            with blocked([ref], "a"):
                helpers._early_rewritten([torch.zeros(3)])
        assert helpers._early_rewritten([torch.zeros(3)]) == 12        # put back after
    finally:
        del helpers._early_probe, helpers._early_rewritten


def test_a_reference_stays_stubbed_until_the_last_rank_leaves():
    """The ranks of a World each enter the block; the first one out must not put the
    reference's code back while another rank still runs (it would call the course's answer)."""
    refs = (Reference("make_buckets", helpers.make_buckets),)
    original = helpers.make_buckets.__code__
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def rank(i):
        if i == 1:
            first_in.wait(10)
        try:
            with blocked(refs, "make_buckets"):
                if i == 0:
                    first_in.set()
                    second_in.wait(10)
                    return
                second_in.set()
                first_out.wait(10)
                seen.append(helpers.make_buckets.__code__ is original)
        finally:
            if i == 0:
                first_out.set()

    ranks = [threading.Thread(target=rank, args=(i,)) for i in (0, 1)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join(20)
    assert seen == [False], "the first rank out put the course's code back for the others"
    assert helpers.make_buckets.__code__ is original, "the last rank out puts it back"
