"""Shortcuts that reach what a check watches by an indirect route fail at the harness's root
(tests/check_cases.py's form), each with the words its refusal names:

1. cancelling arithmetic: a result made of other data, with what arrived added times zero
   (`+ 0 * received`, `add(..., alpha=0)`, `x - x`): the Recorder cuts that flow (observe.py);
2. names built at run time: the course's answer, a collective the exercise does not allow or a
   dispatch switch reached by `getattr`, `importlib`, `vars()` on a computed name (torch's own
   all_reduce reached through `sys.modules` or its `__wrapped__` is the World's: it passes);
3. a reference's code object saved before the check, run as a new function (guard.py refuses
   `function.__new__` on a blocked reference's code while an answer runs);
4. a thread started before the check, idle in library code, fed work later through a queue
   (an executor's internal queue, or a queue a library loop reads): guard.py;
5. sharded clipping whose factor does not come from the all-reduce (check_clip_sharded).

Hooks left on autograd nodes are tested in test_checks_hooks.py, numpy views taken before the
ranks started in test_checks_early_views.py.
"""
import collections
import concurrent.futures
import concurrent.futures.thread as cf_thread
import importlib
import inspect
import operator
import sys
import threading
import types

import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, raw_copy, shortcut

import helpers
import helpers.checks

USED = "the course's own answer"
DECOR = "does not depend on what it received"
HIDDEN = "a thread started before the check ran"


# ---- 1. cancelling arithmetic ---------------------------------------------------------------
_BOARD = torch.zeros(1 << 14)     # made at import: no rank owns it
_SLOT = 1 << 10


def _post(slot, flat):
    """`flat` written on the board with ctypes: no aten operation sees it."""
    flat = flat.detach().contiguous().float()
    raw_copy(_BOARD.data_ptr() + 4 * slot * _SLOT, flat.data_ptr(), 4 * flat.numel())


def _board_mean(k, n):
    return torch.stack([_BOARD[j * _SLOT:j * _SLOT + n].clone() for j in range(k)]).mean(0)


def _bucket_from_board(grads, cancel):
    k, r = dist.get_world_size(), dist.get_rank()
    flat = torch.cat([g.reshape(-1) for g in grads])
    _post(r, flat)
    dist.all_reduce(flat)                      # the right size, the right payload ...
    mean = cancel(_board_mean(k, flat.numel()), flat)   # ... added times zero
    offset = 0
    for g in grads:
        g.copy_(mean[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@shortcut("check_average_bucket", "the board's average plus 0 * the received bucket", DECOR)
def average_bucket_plus_zero_times(grads):
    _bucket_from_board(grads, lambda mean, got: mean + 0 * got)


@shortcut("check_average_bucket", "the board's average, the received bucket added with alpha=0",
          DECOR)
def average_bucket_alpha_zero(grads):
    _bucket_from_board(grads, lambda mean, got: torch.add(mean, got, alpha=0))


@shortcut("check_average_bucket", "the board's average plus (received - received)", DECOR)
def average_bucket_minus_itself(grads):
    _bucket_from_board(grads, lambda mean, got: mean + (got - got))


@shortcut("check_average_bucket", "the board's average plus received times a zero tensor", DECOR)
def average_bucket_times_zeros(grads):
    _bucket_from_board(grads, lambda mean, got: mean + got * torch.zeros(()))


@other("check_average_bucket", "the received bucket times k, divided by k and the world")
def average_bucket_scaled_back(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat = flat * 3 / 3 / dist.get_world_size()       # cancels, but the data is the received
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# ---- 2. names built at run time ------------------------------------------------------------
@shortcut("check_tensor_bytes", "the course's function through importlib and getattr", USED)
def tensor_bytes_by_built_name(tensors):
    return getattr(importlib.import_module("hel" + "pers"), "held_" + "bytes")(tensors)


@shortcut("check_tensor_bytes", "the course's function through vars(sys.modules[...])", USED)
def tensor_bytes_by_module_dict(tensors):
    return vars(sys.modules["".join(["hel", "pers"])])["held_bytes"](tensors)


@shortcut("check_tensor_bytes", "the course's function through globals()", USED)
def tensor_bytes_by_globals(tensors):
    return getattr(globals()["hel" + "pers"], "held" + "_bytes")(tensors)


@shortcut("check_average_bucket", "an all_gather reached by getattr on a built name",
          "allows only all_reduce")
def average_bucket_gather_by_name(grads):
    k = dist.get_world_size()
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(torch.zeros(1))
    out = [torch.empty_like(flat) for _ in range(k)]
    getattr(dist, "all_" + "gather")(out, flat)
    mean = torch.stack(out).mean(0)
    offset = 0
    for g in grads:
        g.copy_(mean[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _bucket_through(grads, all_reduce):
    """The flat bucket summed by `all_reduce` (torch's, however reached), then averaged."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@other("check_average_bucket", "all_reduce read from its module's dict in sys.modules")
def average_bucket_from_module_table(grads):
    _bucket_through(grads, sys.modules["torch.distributed.distributed_c10d"].__dict__[
        "all_reduce"])


@other("check_average_bucket", "torch's undecorated all_reduce (its __wrapped__)")
def average_bucket_unwrapped(grads):
    _bucket_through(grads, dist.all_reduce.__wrapped__)


def test_the_scan_stops_at_the_module_table(monkeypatch):
    """An answer that reads sys.modules reaches every loaded module by name, as
    importlib.import_module does, judged while it runs: the scan does not walk the table, whose
    first entries (ctypes, wherever a process imported it) are no part of the answer's code."""
    from helpers.checks._core import references
    table = {"ctypes": importlib.import_module("ct" + "ypes"), **sys.modules}
    monkeypatch.setattr(sys, "modules", table)
    references.scan(average_bucket_from_module_table, [], "average_bucket")


def test_a_stand_in_unwraps_to_its_own_code():
    """dist.all_reduce's stand-in carries a `__wrapped__` as torch's decorated function does: a
    twin of the stand-in (its code the harness's), never torch's original."""
    from helpers.checks._core.world import World
    original = dist.all_reduce
    chain = {id(original), id(inspect.unwrap(original))}

    def body(comm):
        inner = inspect.unwrap(dist.all_reduce)
        return inner is not dist.all_reduce and id(inner) not in chain and (
            inner.__code__ is dist.all_reduce.__code__)
    assert World(2).run(body) == [True, True]


@shortcut("check_shard_sizes", "tensor_split measured under a dispatch switch named at run time",
          "dispatch")
def shard_sizes_dispatch_off_by_name(n, k):
    with getattr(torch._C, "_Disable" + "TorchDispatch")():
        return [len(s) for s in torch.arange(n).tensor_split(k)]


# ---- 3. a reference's code saved before the check ------------------------------------------
class _Box:
    pass


_BOX = _Box()
_BOX.code = helpers.held_bytes.__code__                  # saved at import, in an attribute
_BOX.where = helpers.held_bytes.__globals__
_CODES = collections.deque([helpers.held_bytes.__code__])


def _unscanned(name):
    """The module global `name`, looked up by a string at run time: the scan before the answer
    runs walks every object it can name, so these early bindings stay for the later guards."""
    return globals()[name]


@shortcut("check_tensor_bytes", "a saved code object run as a new function", "a copy of")
def tensor_bytes_saved_code(tensors):
    return types.FunctionType(_unscanned("_BOX").code, _unscanned("_BOX").where)(tensors)


@shortcut("check_tensor_bytes", "a saved code object (in a deque) run as a new function",
          "a copy of")
def tensor_bytes_saved_code_in_deque(tensors):
    return type(lambda: 0)(_unscanned("_CODES")[0], _unscanned("_BOX").where, "mine")(tensors)


# ---- 5. sharded clipping whose factor is not the all-reduce's ------------------------------
_CALLS = collections.Counter()
_CALLS_LOCK = threading.Lock()


@shortcut("check_clip_sharded", "the norm all-reduced, the factor guessed from the call count",
          "not scaled")
def clip_sharded_guessed_factor(shards, max_norm):
    rank, world = dist.get_rank(), dist.get_world_size()
    with _CALLS_LOCK:
        n = _CALLS[(world, rank)]
        _CALLS[(world, rank)] += 1
    sq = torch.stack([p.grad.pow(2).sum() for p in shards]).sum()
    dist.all_reduce(sq)
    coef = 0.3 if n % 3 < 2 else 1.0           # the check's first two cases clip to 0.3
    for p in shards:
        p.grad.mul_(coef)
    return sq.sqrt()


@shortcut("check_clip_sharded", "the norm all-reduced, the factor from a norm recomputed from "
          "max_norm", "not scaled")
def clip_sharded_norm_from_max_norm(shards, max_norm):
    sq = torch.stack([p.grad.pow(2).sum() for p in shards]).sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    if float(norm) > max_norm:                  # one bit of the received norm steers ...
        for p in shards:                        # ... a factor from the check's old ratio 0.3
            p.grad.mul_(max_norm / (max_norm / 0.3 + 1e-6))
    return norm


@shortcut("check_clip_sharded", "the factor from a board, the received norm added times zero",
          DECOR)
def clip_sharded_factor_from_board(shards, max_norm):
    k, r = dist.get_world_size(), dist.get_rank()
    sq = torch.stack([p.grad.pow(2).sum() for p in shards]).sum()
    _post(r, sq.reshape(1))
    dist.all_reduce(sq)                          # what arrived: used only times zero
    total = _board_mean(k, 1).sum() * k
    coef = torch.clamp(max_norm / (total.sqrt() + 1e-6), max=1.0) + 0 * sq
    for p in shards:
        p.grad.mul_(coef)
    return sq.sqrt()


# ---- 4. threads started before the check, fed later -----------------------------------------
class _QueueLoop:
    """A thread that runs only library code (a deque consuming a map over a queue) until the
    answer puts a function on its queue."""

    def __init__(self):
        self.jobs = __import__("queue").SimpleQueue()
        self.thread = threading.Thread(
            target=collections.deque, args=(map(operator.call, iter(self.jobs.get, None)), 0),
            daemon=True)
        self.thread.start()

    def ask(self, fn):
        box, done = [], threading.Event()
        self.jobs.put(lambda: (box.append(fn()), done.set()))
        done.wait(10)
        return box[0]

    def stop(self):
        self.jobs.put(None)
        self.thread.join()


@pytest.fixture
def queue_loop():
    loop = _QueueLoop()
    yield loop
    loop.stop()


@pytest.fixture
def warm_pool():
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(int).result()                   # its worker started now, idle afterwards
    yield pool
    pool.shutdown()


def _through_work_queue(pool, fn):
    future = concurrent.futures.Future()
    pool._work_queue.put(cf_thread._WorkItem(future, fn, (), {}))
    return future.result(10)


def _failed(check, fn, words):
    result = getattr(helpers.checks, check)(fn)
    assert result.status == "failed", result
    assert words in result.message, result.message


def test_thread_fed_through_a_library_loop_fails(queue_loop):
    _failed("check_shard_sizes", lambda n, k: queue_loop.ask(
        lambda: [len(s) for s in torch.arange(n).tensor_split(k)]), HIDDEN)


def test_pool_fed_through_its_work_queue_fails(warm_pool):
    _failed("check_shard_sizes", lambda n, k: _through_work_queue(
        warm_pool, lambda: [len(s) for s in torch.arange(n).tensor_split(k)]), HIDDEN)


def test_pool_started_early_and_idle_is_no_refusal(warm_pool):
    """An idle pool made before the check (a notebook's `stream`) fails no right answer, and
    what the answer submits to it is observed: a split measured there still fails."""
    result = helpers.checks.check_shard_sizes(
        lambda n, k: [n // k + (i < n % k) for i in range(k)])
    assert result.status == "passed", result
    _failed("check_shard_sizes", lambda n, k: warm_pool.submit(
        lambda: [len(s) for s in torch.arange(n).tensor_split(k)]).result(), "split")


test_case = parametrize_cases(__name__)


def test_cancels_reads_no_data_pointer_of_a_fake_tensor():
    """The check's own comparison of storages must not touch a FakeTensor's data pointer: torch
    warns on it, and a warning printed in a chapter's check cell fails nbval there."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    from helpers.checks._core.cancels import _same
    with FakeTensorMode():
        a = torch.zeros(3)
        b = a.view(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _same(a, b)
    x = torch.zeros(3)
    assert _same(x, x.view(3))
