"""What an answer may reach beyond what it is handed, each with the words its refusal names:

1. a library function the check computes or compares with after the answer returns
   (`builtins.abs`, `torch.allclose`), rebound directly or from a thread that outlives the call:
   Answer fails it and puts the original back (patched.py), and never mistakes the harness's own
   stand-ins for the answer's;
2. the simulated GPUs behind check_time_it's timed fn and synchronize stand-in (`__defaults__`,
   a bound method's `__self__`): fn is a closure, the stand-in a plain function, and
   `__defaults__` is refused as introspection;
3. the module and parameter hook tables through which checks observe forwards and backwards,
   called by hand to forge what one graph with one backward skipped: refused by name.
"""
import builtins
import statistics
import threading
import time
import types

import torch
import torch.nn.functional as F
from check_cases import parametrize_cases, shortcut

REPLACED = "replaced"
THREAD = "a thread it started"
INSPECTS = "inspects the running program"


# ---- 1: a library function rebound ------------------------------------------------------------
def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


@shortcut("check_lr_at", "rebinds builtins.abs so the check's tolerance always holds", REPLACED)
def lr_at_abs_rebound(step, base_lr, base_batch, batch, warmup):
    builtins.abs = lambda x: 0.0
    return 0.0


@shortcut("check_dp_average", "inverts torch.allclose and never divides", REPLACED)
def dp_average_allclose_rebound(grads, comm):
    original = torch.allclose
    torch.allclose = lambda a, b, *x, **k: not original(a, b, *x, **k)
    for t in grads:
        comm.all_reduce(t)


class _Lstsq:
    """A stand-in torch.linalg whose lstsq hands the check the answer's own fit."""

    def __init__(self, real, fit):
        self.real, self.fit = real, fit

    def __getattr__(self, name):
        return getattr(self.real, name)

    def lstsq(self, A, B, *args, **kwargs):
        if A.dtype == torch.float64:
            alpha, slope = self.fit
            return types.SimpleNamespace(solution=torch.tensor([[alpha], [slope]],
                                                               dtype=A.dtype))
        return self.real.lstsq(A, B, *args, **kwargs)


@shortcut("check_fit_copy_model", "rebinds the submodule torch.linalg to make the check's fit "
          "agree with an unweighted two-point line", REPLACED)
def fit_copy_model_submodule_rebound(nbytes, seconds):
    slope = (seconds[-1] - seconds[0]) / (nbytes[-1] - nbytes[0])
    alpha = seconds[0] - slope * nbytes[0]
    real = torch.linalg
    torch.linalg = types.ModuleType("torch.linalg")
    torch.linalg.__dict__.update(
        {k: v for k, v in vars(real).items() if not k.startswith("__")},
        lstsq=_Lstsq(real, (alpha, slope)).lstsq)
    return alpha, 1 / slope / 1e9


_LATE = []


def _rebind_later():
    time.sleep(0.02)
    builtins.abs = lambda x: 0.0


@shortcut("check_lr_at", "rebinds builtins.abs from a thread after returning",
          [(REPLACED, THREAD)])     # the thread outlives the call (outlived.py), or rebinds
def lr_at_abs_rebound_late(step, base_lr, base_batch, batch, warmup):
    if not _LATE:
        _LATE.append(threading.Thread(target=_rebind_later, daemon=True))
        _LATE[0].start()
        return _lr(step, base_lr, base_batch, batch, warmup)
    time.sleep(0.05)
    return 0.0


_STOP = threading.Event()


@shortcut("check_lr_at", "leaves a thread running that could rebind later", THREAD)
def lr_at_thread_left(step, base_lr, base_batch, batch, warmup):
    threading.Thread(target=_STOP.wait, args=(5,), daemon=True).start()
    return _lr(step, base_lr, base_batch, batch, warmup)


# ---- 2: check_time_it's simulation reached through what it hands over ---------------------------
def _forge(sim, fn, reps):
    now = time.perf_counter()
    for d in sim.devices:
        sim.events.append(("sync", d, max(now, sim.busy[d])))
    ts = []
    for _ in range(reps):
        fn()
        start, end = sim.starts[-1], max(sim.busy.values())
        for d in sim.devices:
            sim.events.append(("sync", d, end))
        ts.append(end - start)
    return statistics.median(ts)


@shortcut("check_time_it", "forges the sync events through fn.__defaults__", INSPECTS)
def time_it_through_defaults(fn, devices, reps):
    return _forge(fn.__defaults__[0], fn, reps)


@shortcut("check_time_it", "forges the sync events through the stand-in's __self__",
          "no attribute '__self__'")
def time_it_through_self(fn, devices, reps):
    return _forge(torch.cuda.synchronize.__self__, fn, reps)


# ---- 3: the check's hooks called by hand --------------------------------------------------------
@shortcut("check_accumulate_zero2", "one graph, one backward; forwards run unhooked (.forward) and "
          "the check's pre-hooks called by hand for one forward", INSPECTS)
def zero2_one_graph_unhooked(model, micro_batches):
    net = model.module
    loss = sum(F.cross_entropy(net.forward(X), y) for X, y in micro_batches) / len(micro_batches)
    for hook in list(net._forward_pre_hooks.values()):
        hook(net, (micro_batches[0][0],))
    loss.backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_scratch_accumulate", "one graph, one backward; the check's post-accumulate hook "
          "called by hand k-1 more times", INSPECTS)
def scratch_accumulate_forged_backwards(model, loss_fn, micro_batches):
    k = len(micro_batches)
    first = next(model.parameters())
    loss = sum(loss_fn(model(X), y) for X, y in micro_batches) / k
    loss.backward()
    model.finish_gradient_synchronization()
    for hook in list(first._post_accumulate_grad_hooks.values()):
        if "checks" in getattr(getattr(hook, "__code__", None), "co_filename", ""):
            for _ in range(k - 1):
                hook(first)


# ---- 4: what the public functions call, classes, the course's façade, stand-ins -----------------
@shortcut("check_lr_at", "rebinds the private C loss torch's F.mse_loss looks up each call",
          REPLACED)
def lr_at_private_c_rebound(step, base_lr, base_batch, batch, warmup):
    torch._C._nn.mse_loss = lambda *a, **k: torch.zeros(())
    return 0.0


@shortcut("check_lr_at", "adds a split to torch._VF, which Tensor.split looks up each call",
          REPLACED)
def lr_at_vf_added(step, base_lr, base_batch, batch, warmup):
    torch._VF.split_with_sizes = lambda *a, **k: ()
    return 0.0


@shortcut("check_lr_at", "replaces a library class's method (nn.MSELoss.forward)", REPLACED)
def lr_at_class_method(step, base_lr, base_batch, batch, warmup):
    torch.nn.MSELoss.forward = lambda self, a, b: torch.zeros(())
    return 0.0


@shortcut("check_lr_at", "replaces a function of the course's façade the check imports later",
          REPLACED)
def lr_at_facade_rebound(step, base_lr, base_batch, batch, warmup):
    import sys
    sys.modules["help" + "ers"].make_model = lambda *a, **k: None
    return 0.0


@shortcut("check_dp_average", "deletes the watching stand-in of Tensor.tolist, then reads the "
          "other ranks' gradients as Python numbers", REPLACED)
def dp_average_stand_in_deleted(grads, comm):
    del torch.Tensor.tolist
    for t in grads:
        comm.all_reduce(t)
        t /= comm.size


@shortcut("check_dp_average", "reaches torch's original tolist through the stand-in's "
          "__wrapped__", "has no attribute '__wrapped__'")
def dp_average_unwrapped(grads, comm):
    _ = torch.Tensor.tolist.__wrapped__
    for t in grads:
        comm.all_reduce(t)
        t /= comm.size


test_case = parametrize_cases(__name__)


def test_the_originals_are_put_back():
    """After a refused rebinding, the library functions are the originals again, and a right
    answer run next passes."""
    import helpers.checks
    originals = (builtins.abs, torch.allclose, torch.Tensor.add)

    def lr_at(step, base_lr, base_batch, batch, warmup):
        builtins.abs, torch.allclose = (lambda x: 0.0), (lambda *a, **k: True)
        torch.Tensor.add = lambda *a, **k: None
        torch.Tensor.invented = lambda self: 0
        return 0.0
    result = helpers.checks.check_lr_at(lr_at)
    assert result.status == "failed" and REPLACED in result.message, result
    assert (builtins.abs, torch.allclose, torch.Tensor.add) == originals
    assert not hasattr(torch.Tensor, "invented")
    assert helpers.checks.check_lr_at(_lr).status == "passed"


def test_the_comparison_is_not_made_of_what_the_answer_replaces():
    """The namespaces are compared by identity in C (`all`, `map`, `len`, `operator.is_`): an
    answer that replaces those too, to make every namespace look unchanged, is still refused,
    and everything is put back."""
    import operator

    import helpers.checks
    originals = (builtins.all, builtins.map, builtins.len, operator.is_, torch.allclose)

    def lr_at(step, base_lr, base_batch, batch, warmup):
        torch.allclose = lambda *a, **k: True
        builtins.all, builtins.map = (lambda it: True), (lambda *a: ())
        builtins.len, operator.is_ = (lambda x: 0), (lambda a, b: True)
        return 0.0
    result = helpers.checks.check_lr_at(lr_at)
    assert result.status == "failed" and REPLACED in result.message, result
    assert (builtins.all, builtins.map, builtins.len, operator.is_, torch.allclose) == originals


def test_an_answer_may_set_its_own_globals():
    """Rebinding names in the answer's own module is not watched."""
    import helpers.checks

    def lr_at(step, base_lr, base_batch, batch, warmup):
        globals()["_SEEN"] = step
        return _lr(step, base_lr, base_batch, batch, warmup)
    assert helpers.checks.check_lr_at(lr_at).status == "passed"


def test_a_stand_in_gone_before_the_answer_returns_is_not_put_back():
    """A rank still answering when its World has put torch back (a straggler after a deadline)
    saw the harness's stand-ins in its snapshot: they are never put back (functools.wraps gives
    them the original's __module__), or a stale stand-in would bend every later check in the
    process."""
    from helpers.checks._core import exits, patched
    originals = {name: torch.Tensor.__dict__.get(name) for name in exits.EXITS}
    with exits.watch_exits(lambda t, how: None):
        assert torch.Tensor.__dict__["tolist"] is not originals["tolist"]
        before = patched.snapshot()
    try:        # judged as the answer's doing (a stand-in it found is gone), never put back
        patched.expect_unpatched("answer", before)
    except patched.CheckFailed as e:
        assert REPLACED in str(e)
    assert {name: torch.Tensor.__dict__.get(name) for name in exits.EXITS} == originals
    assert torch.ones(2).tolist() == [1.0, 1.0]


def test_a_rank_left_running_past_the_deadline_leaves_torch_as_it_was():
    """The same, end to end: a rank's answer still running when its World gave up returns
    after the World put torch back; torch's tensor methods and torch.distributed stay torch's."""
    import pytest
    import torch.distributed as dist

    from helpers.checks._core import exits
    from helpers.checks._core.declare import Answer
    from helpers.checks._core.world import World
    from helpers.runtime import errors
    names = (*exits.EXITS, "item")
    tensor_before = {name: torch.Tensor.__dict__.get(name) for name in names}
    dist_before = dict(vars(dist))
    stop, done = threading.Event(), threading.Event()

    def late(comm):
        if comm.rank:
            stop.wait(5)

    answer = Answer(late, "late", [])

    def body(comm):
        try:
            answer(comm)
        finally:
            if comm.rank:
                done.set()
    world = World(2, timeout=0.1)
    world.deadline = 0.5
    with pytest.raises(errors.LaunchTimeout):
        world.run(body)
    stop.set()
    assert done.wait(5)
    time.sleep(0.1)              # the straggler's Answer checks the libraries as it returns
    assert {name: torch.Tensor.__dict__.get(name) for name in names} == tensor_before
    assert {k: v for k, v in vars(dist).items() if dist_before.get(k) is not v} == {}


def test_ranks_that_replace_one_function_in_turn_leave_the_original():
    """Rank 1 starts after rank 0 replaced torch.allclose, and returns after rank 0's answer
    put the original back: rank 1's answer must not take rank 0's replacement for the original
    and put it back (every later check in the process would compare with it). The answers
    running at once share the snapshot taken before the first of them started."""
    import pytest

    from helpers.checks._core import patched
    from helpers.checks._core.run import CheckFailed
    original = torch.allclose
    rank0 = patched.snapshot()                                      # rank 0 starts
    torch.allclose = lambda a, b, *x, **k: not original(a, b, *x, **k)
    rank1 = patched.snapshot()                                      # rank 1 starts
    with pytest.raises(CheckFailed, match=REPLACED):
        patched.expect_unpatched("rank 0", rank0)                   # rank 0 returns
    assert torch.allclose is original
    torch.allclose = lambda a, b, *x, **k: not original(a, b, *x, **k)
    with pytest.raises(CheckFailed, match=REPLACED):
        patched.expect_unpatched("rank 1", rank1)                   # rank 1 returns
    assert torch.allclose is original


def test_an_answer_that_raises_puts_back_what_it_replaced():
    """A replacement does not outlive an answer that raised (or a rank stopped mid-call)."""
    import helpers.checks
    original = torch.allclose

    def lr_at(step, base_lr, base_batch, batch, warmup):
        torch.allclose = lambda *a, **k: True
        raise ValueError("no")
    result = helpers.checks.check_lr_at(lr_at)
    assert result.status == "failed" and REPLACED in result.message, result
    assert torch.allclose is original


def test_the_harness_stand_ins_do_not_carry_their_originals():
    """A stand-in looks like what it replaces, without the `__wrapped__` an answer could call."""
    from helpers.checks._core import exits
    with exits.watch_exits(lambda t, how: None):
        stand_in = torch.Tensor.__dict__["tolist"]
        assert stand_in.__name__ == "tolist" and not hasattr(stand_in, "__wrapped__")


def test_classes_c_functions_and_the_facade_are_put_back():
    import sys

    import helpers
    import helpers.checks
    originals = (torch._C._nn.mse_loss, torch.nn.MSELoss.forward, helpers.make_model)
    for answer in (lr_at_private_c_rebound, lr_at_class_method, lr_at_facade_rebound,
                   lr_at_vf_added):
        assert REPLACED in helpers.checks.check_lr_at(answer).message
    assert (torch._C._nn.mse_loss, torch.nn.MSELoss.forward, helpers.make_model) == originals
    assert "split_with_sizes" not in vars(torch._VF) and sys.modules["helpers"] is helpers


def test_a_library_hooking_an_inherited_method_is_not_the_answers_patch():
    """The first optimizer of a class hooks its class's step (torch.optim wraps the inherited
    Adam.step into AdamW's own dict): a right answer that builds one is not refused. Both
    classes are set back to before their first optimizer (an Adam made earlier in the process
    hooked the step AdamW inherits), and the snapshot is always closed (a shared one left open
    would be every later answer's)."""
    from helpers.checks._core import patched
    hooked = {c: vars(c).get("step") for c in (torch.optim.AdamW, torch.optim.Adam)}
    if hooked[torch.optim.AdamW] is not None:
        delattr(torch.optim.AdamW, "step")      # as before the process's first AdamW
    if getattr(hooked[torch.optim.Adam], "hooked", False):
        torch.optim.Adam.step = hooked[torch.optim.Adam].__wrapped__   # and its first Adam
    try:
        before = patched.snapshot()
        try:
            torch.optim.AdamW([torch.zeros(2, requires_grad=True)])
            assert "step" in vars(torch.optim.AdamW)
        finally:
            patched.expect_unpatched("answer", before)
    finally:
        for cls, step in hooked.items():
            if step is not None:
                cls.step = step
