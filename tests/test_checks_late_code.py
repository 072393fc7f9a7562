"""The reader's code that runs after the answer returned, while the check still judges it (late.py),
each with the words its refusal names:

1. a custom autograd Function's backward, run by the check's own backward: a window of the
   answer's (libraries and the harness's globals compared around it, frames guarded);
2. the route into the engine replaced by the answer, so the check's backward would run unwatched;
3. code run outside any window (a weakref callback): the comparison when the check body ends.
"""
import importlib
import sys
import weakref

import pytest
import torch
from check_cases import escape_young, other, parametrize_cases, shortcut

LATE = "after your function returned"
REPLACED = "replaced"


def _inputs():
    return importlib.import_module("helpers.che" + "cks._core.in" + "puts")


def _yes(*args, **kwargs):
    return True


def _per_rank_mean(losses, late):
    """The wrong answer (the mean of per-rank means), through a Function whose backward runs
    `late()` inside the check's backward."""
    class Mean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.n = x.numel()
            return x.mean()

        @staticmethod
        def backward(ctx, g):
            late()
            return g.expand(ctx.n) / ctx.n
    return Mean.apply(losses)


# ---- 1: a Function's backward -----------------------------------------------------------------
@shortcut("check_rank_loss", "per-rank mean; the backward rebinds the harness's comparison",
          [LATE, REPLACED, "_ALLCLOSE"])
def rank_loss_backward_rebinds_harness(losses, global_batch, world_size):
    return _per_rank_mean(losses, lambda: setattr(_inputs(), "_ALL" + "CLOSE", _yes))


@shortcut("check_rank_loss", "per-rank mean; the backward rebinds torch.allclose",
          [LATE, REPLACED, "torch.allclose"])
def rank_loss_backward_rebinds_torch(losses, global_batch, world_size):
    return _per_rank_mean(losses, lambda: setattr(torch, "allclose", _yes))


_SAVED = []


def _toggle():
    module = _inputs()
    if _SAVED:
        setattr(module, "_ALL" + "CLOSE", _SAVED.pop())      # put back before the verdict ends
    else:
        _SAVED.append(getattr(module, "_ALL" + "CLOSE"))
        setattr(module, "_ALL" + "CLOSE", _yes)


@shortcut("check_rank_loss", "per-rank mean; one backward rebinds, the next puts it back",
          [LATE, REPLACED])
def rank_loss_backward_toggles(losses, global_batch, world_size):
    return _per_rank_mean(losses, _toggle)


def _read_frames():
    try:
        sys._getframe(2)
    except BaseException:
        pass


@shortcut("check_rank_loss", "per-rank mean; the backward reads the check's frames",
          "inspects the running program")
def rank_loss_backward_reads_frames(losses, global_batch, world_size):
    return _per_rank_mean(losses, _read_frames)


def _recompute(x):
    if torch.is_grad_enabled() and not _SAVED:
        _SAVED.append(0)
    elif _SAVED:
        torch.allclose = _yes                    # the recomputation, in the check's backward
    return x.exp().log()                         # saves a tensor: recomputed


@shortcut("check_rank_loss", "per-rank mean; a checkpoint's recomputation rebinds allclose",
          [LATE, REPLACED, "torch.allclose"])
def rank_loss_checkpoint_recompute(losses, global_batch, world_size):
    _SAVED.clear()
    return torch.utils.checkpoint.checkpoint(_recompute, losses, use_reentrant=False).mean()


def _raise():
    raise ValueError("from the backward")


@shortcut("check_rank_loss", "a backward that raises: the reader's error, not the check's",
          ["your code raised ValueError", "from the backward"])
def rank_loss_backward_raises(losses, global_batch, world_size):
    return _per_rank_mean(losses, _raise)


@other("check_rank_loss", "the global-batch scaling through a Function of its own")
def rank_loss_through_function(losses, global_batch, world_size):
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum() * world_size / global_batch

        @staticmethod
        def backward(ctx, g):
            return g.expand(losses.shape) * world_size / global_batch
    return Scaled.apply(losses)


# ---- 2: the route into the engine replaced ----------------------------------------------------
@shortcut("check_rank_loss", "per-rank mean; the route into the engine replaced, then rebinding",
          [REPLACED, "_engine_run_backward"])
def rank_loss_engine_replaced(losses, global_batch, world_size):
    graph = importlib.import_module("torch.autograd.gr" + "aph")
    setattr(torch.autograd, "_engine_run_" + "backward", getattr(graph, "_course" + "_engine"))
    return _per_rank_mean(losses, lambda: setattr(torch, "allclose", _yes))


# ---- 3: outside any window: the comparison at the end ----------------------------------------


@shortcut("check_rank_loss", "per-rank mean; a weakref callback rebinds the harness's comparison",
          [LATE, REPLACED, "_ALLCLOSE"])
def rank_loss_weakref_callback(losses, global_batch, world_size):
    escape_young(weakref.ref(losses, lambda ref: setattr(_inputs(), "_ALL" + "CLOSE", _yes)))
    return losses.mean()


test_case = parametrize_cases(__name__)


def test_a_fresh_regrade_fails_the_late_rebinding(monkeypatch, capsys):
    """The same through fresh.regrade (the student edition's hidden tests): every loaded copy of
    the harness's comparison rebound in the backward."""
    from helpers.checks._core.fresh import regrade

    def everywhere():
        for module in list(sys.modules.values()):
            if hasattr(module, "_ALL" + "CLOSE"):
                setattr(module, "_ALL" + "CLOSE", _yes)

    def rank_loss(losses, global_batch, world_size):
        return _per_rank_mean(losses, everywhere)
    monkeypatch.setenv("COURSE_GRADING", "1")
    with pytest.raises(AssertionError, match="its backward"):
        regrade("check_rank_loss", rank_loss)
    assert _inputs()._ALLCLOSE is not _yes and torch.allclose is not _yes


def test_a_regrade_leaves_the_route_into_the_engine_to_the_harness():
    """A fresh copy of the checks installs its own route into autograd's engine; once the regrade
    is over, the harness loaded before it gets it back (else its next check reads the copy's
    route as a replacement the answer made)."""
    from helpers.checks._core import fresh, late

    def shard_sizes_right(n, k):
        return [n // k + (i < n % k) for i in range(k)]

    before = torch.autograd._engine_run_backward
    assert before is late._run_backward
    fresh.regrade("check_shard_sizes", shard_sizes_right)
    assert torch.autograd._engine_run_backward is before
    assert torch.autograd.graph._engine_run_backward is before
