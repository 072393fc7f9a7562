"""A check computes nothing from its inputs before the answer's first call (the harness's rule:
run the answer first, compute the expected value after). Work done earlier is open to anything of
the reader's that watches the process (a global module hook, a dispatch mode entered in an
earlier cell): it would hand the answer the check's own expected value.

Enforced at run time, for every check with its worked answer: the harness's Recorder watches the
check body's thread from its start to the answer's first call, and every operation that computes
(observe.py's `is_work`: not a copy, view, fresh or random tensor) must flow into what the answer
is handed (its arguments, the parameters, buffers and gradients of modules among them): making
the inputs. A check's World ranks run in threads of their own, unwatched here.
"""
import importlib
import pathlib
import threading
import types

import pytest
import torch
from check_cases import CASES
from torch.utils._python_dispatch import _get_current_dispatch_mode

import helpers.checks
from helpers.checks._core import REGISTRY, declare, expect, fresh_generator
from helpers.checks._core.observe import Recorder

TESTS = pathlib.Path(__file__).resolve().parent
for path in sorted(TESTS.glob("test_checks_*.py")):
    if path.stem not in ("test_checks_registry", "test_checks_before_the_call"):
        importlib.import_module(path.stem)     # fills CASES

CHECKS = sorted(n for n in dir(helpers.checks) if n.startswith("check_") and CASES[n]["worked"])
# found computing before the first call when this test was written, still to move after it (or,
# for a World check whose ranks are handed pieces made in the main thread, to tell apart)
TO_MOVE = frozenset({
    "check_accumulate_zero2", "check_average_bucket", "check_bucket_allreduce",
    "check_bytes_sent_naive_vs_ring", "check_choose_checkpoints", "check_clip_sharded",
    "check_dcp_resume", "check_fit_copy_model", "check_fsdp_units", "check_qwz_all_gather",
    "check_resume"})


def _tensors(value, found, depth=0):
    """The tensors `value` hands over: itself, containers' items, modules' parameters, buffers
    and gradients, optimizers' parameters and state, a namespace's attributes."""
    if depth > 6:
        return found
    if isinstance(value, torch.Tensor):
        found.append(value)
        if value.grad is not None:
            found.append(value.grad)
    elif isinstance(value, torch.nn.Module):
        for t in (*value.parameters(), *value.buffers()):
            _tensors(t, found, depth + 1)
    elif isinstance(value, torch.optim.Optimizer):
        _tensors([g["params"] for g in value.param_groups], found, depth + 1)
        _tensors(list(value.state.values()), found, depth + 1)
    elif isinstance(value, dict):
        _tensors(list(value.values()), found, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _tensors(item, found, depth + 1)
    elif isinstance(value, types.SimpleNamespace):
        _tensors(vars(value), found, depth + 1)
    return found


class Probe:
    """Records the check body's thread from the body's start (the Answer made for it) to the
    answer's first call; `early()`: the operations that computed without making the inputs."""

    def __init__(self, monkeypatch):
        self.rec, self.thread, self.cut, self.needed = None, None, None, set()
        init, call = declare.Answer.__init__, declare.Answer.__call__
        probe = self

        def start(answer, *args, **kwargs):
            init(answer, *args, **kwargs)
            if probe.rec is None:
                probe.rec, probe.thread = Recorder(), threading.get_ident()
                probe.rec.__enter__()

        def called(answer, *args, **kwargs):
            rec = probe.rec
            if rec is not None:
                if probe.cut is None:
                    probe.cut = len(rec.ops)
                    probe.stop()
                probe.needed |= {op.index for op in rec.ancestors(*_tensors((args, kwargs), []))
                                 if op.index < probe.cut}
            return call(answer, *args, **kwargs)

        monkeypatch.setattr(declare.Answer, "__init__", start)
        monkeypatch.setattr(declare.Answer, "__call__", called)

    def stop(self):
        """Leave the Recorder when it is on top of this thread's modes (else at the end)."""
        if self.rec is not None and threading.get_ident() == self.thread \
                and _get_current_dispatch_mode() is self.rec and not getattr(self, "left", False):
            self.rec.__exit__(None, None, None)
            self.left = True

    def early(self):
        ops = self.rec.ops[:self.cut] if self.rec is not None else []
        return [op for op in ops if op.is_work and op.index not in self.needed]


def _early_work(monkeypatch, check, fn):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    probe = Probe(monkeypatch)
    try:
        result = check(fn)
    finally:
        probe.stop()
    return result, probe.early()


@pytest.mark.parametrize("name", [pytest.param(
    n, marks=pytest.mark.xfail(strict=True, reason="computes before the call")) if n in TO_MOVE
    else n for n in CHECKS])
def test_nothing_is_computed_before_the_answer_runs(name, monkeypatch):
    case = CASES[name]["worked"][0]
    result, early = _early_work(monkeypatch, getattr(helpers.checks, name), case.fn)
    assert not early, (f"{name} computed before calling the answer: "
                       f"{', '.join(sorted({repr(op) for op in early})[:4])}; compute the "
                       "expected value after the call")
    assert result.status == "passed", f"{case}: {result}"


def _double(x):
    return x * 2


def test_the_probe_sees_a_reference_computed_before_the_call(monkeypatch):
    """The test above fails a check that computes its expected value first."""
    @declare.check("probe_early", observes=["x * 2"])
    def check_probe_early(fn):
        x = torch.randn(5, generator=fresh_generator()) + 1      # making the input: allowed
        want = torch.nn.functional.softplus(x) * 0 + x * 2       # the reference: before the call
        expect(torch.equal(fn(x), want), "x * 2")

    @declare.check("probe_after", observes=["x * 2"])
    def check_probe_after(fn):
        x = torch.randn(5, generator=fresh_generator()) + 1
        got = fn(x)
        expect(torch.equal(got, x * 2), "x * 2")

    try:
        with monkeypatch.context() as m:
            result, early = _early_work(m, check_probe_early, _double)
        assert result.passed and {op.name for op in early} >= {"softplus", "mul"}, early
        with monkeypatch.context() as m:
            result, early = _early_work(m, check_probe_after, _double)
        assert result.passed and not early, early
    finally:
        REGISTRY.pop("check_probe_early", None)
        REGISTRY.pop("check_probe_after", None)
