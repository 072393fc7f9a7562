"""After the answer's window closes the harness walks what it handed the answer (hooks.py's
search for hooks left behind, a World rank's result searched for other ranks' numbers), and an
exercise that changes its inputs may have had objects of the reader's put there. The walk reads
them by exact types, the base types' own methods and the getters Python made: an isinstance
(a `__class__` property), a hasattr (a `__dict__` property), a list subclass's `__iter__` or a
dict subclass's `values` would run the reader's code outside the window. Each shortcut here is a
wrong answer (a sum never divided) that such a read would have fixed after the call."""

import pytest
import torch
from check_cases import not_grading, quiet  # noqa: F401 (not_grading: autouse)

import helpers
import helpers.checks
from helpers.checks._core.hooks import hooks_of


# ---- a World check: dp_average's handed list --------------------------------------------------
class _Divides:
    """Put into a rank's gradient list: its `__class__` property (what isinstance reads) divides
    the summed gradients by the number of ranks and takes itself out of the list."""

    def __init__(self, grads, world):
        self.grads, self.world, self.done = grads, world, False

    @property
    def __class__(self):
        if not self.done:
            self.done = True
            with torch.no_grad():
                for t in self.grads[:-1]:
                    t.div_(self.world)
            del self.grads[-1]
        return _Divides


def _dp_summed(grads, comm):
    for t in grads:
        comm.all_reduce(t)


def _dp_right(grads, comm):
    for t in grads:
        comm.all_reduce(t)
        t.div_(comm.world)


def test_a_class_property_in_a_world_checks_list_runs_nothing():
    def dp_average(grads, comm):
        _dp_summed(grads, comm)
        grads.append(_Divides(grads, comm.world))
    result = quiet(helpers.checks.check_dp_average, dp_average)
    assert not result.passed, result


def test_a_right_world_answer_passes():
    result = quiet(helpers.checks.check_dp_average, _dp_right)
    assert result.passed, result.message


# ---- a plain check that accepts changed inputs: accumulated_step's params ---------------------
def _step(net, params, X, y, num_micro, lr, divide):
    """Accumulate the micro-batches' summed losses in .grad, then step: divided by the batch
    size (right) or not (the wrong answer each shortcut fixes later); the gradients returned."""
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    grads = []
    with torch.no_grad():
        for p in params:
            grads.append(p.grad.clone())
            p -= lr * p.grad / (X.shape[0] if divide else 1)
            p.grad = None
    return grads


def _fix(params, grads, lr, n):
    """What each shortcut's later read does: the step made right, the extra item taken out."""
    with torch.no_grad():
        for p, g in zip(params[:2], grads, strict=True):
            p += lr * g * (1 - 1 / n)
    del params[-1]


class _ClassFixes:
    def __init__(self, *late):
        self.late, self.done = late, False

    @property
    def __class__(self):
        if not self.done:
            self.done = True
            _fix(*self.late)
        return _ClassFixes


class _IterFixes(list):
    late = ()

    def __iter__(self):
        if self.late:
            _fix(*self.late)
            self.late = ()
        return list.__iter__(self)


class _ValuesFixes(dict):
    late = ()

    def values(self):
        if self.late:
            _fix(*self.late)
            self.late = ()
        return dict.values(self)


class _DictFixes(torch.nn.Module):
    """A module whose `__dict__` property (what hasattr(obj, "__dict__") reads) fixes the step
    once armed."""
    late = ()

    @property
    def __dict__(self):
        if self.late:
            late = self.late
            object.__setattr__(self, "late", ())    # nn.Module's own would read __dict__
            _fix(*late)
        return vars(torch.nn.Module)["__dict__"].__get__(self)

    def _arm(self, late):
        self.late = late
        return self


def _put_later(make):
    def accumulated_step(net, params, X, y, num_micro, lr):
        grads = _step(net, params, X, y, num_micro, lr, divide=False)
        params.append(make((params, grads, lr, X.shape[0])))
    return accumulated_step


def _with_late(cls):
    def make(late):
        obj = cls()
        obj.late = late
        return obj
    return make


@pytest.mark.parametrize("make", [
    lambda late: _ClassFixes(*late),
    _with_late(_IterFixes),
    _with_late(_ValuesFixes),
    lambda late: _DictFixes()._arm(late),
], ids=["class-property", "list-subclass-iter", "dict-subclass-values", "dict-property"])
def test_an_object_put_in_a_changed_input_runs_nothing(make):
    result = quiet(helpers.checks.check_accumulated_step, _put_later(make))
    assert not result.passed, result


def test_a_right_answer_with_changed_inputs_passes():
    def accumulated_step(net, params, X, y, num_micro, lr):
        _step(net, params, X, y, num_micro, lr, divide=True)
    result = quiet(helpers.checks.check_accumulated_step, accumulated_step)
    assert result.passed, result.message


# ---- the walk still finds a hook wherever the reader's containers hold a tensor ----------------
@pytest.mark.parametrize("wrap", [
    lambda t: [t], lambda t: _IterFixes([t]), lambda t: _ValuesFixes(x=t),
    lambda t: torch.nn.ParameterList([torch.nn.Parameter(t)]),
], ids=["list", "list-subclass", "dict-subclass", "module"])
def test_a_hook_on_an_appended_tensor_is_found(wrap):
    handed = []
    before = hooks_of((handed,), {})
    t = torch.zeros(2, requires_grad=True)
    held = wrap(t)
    target = t if not isinstance(held, torch.nn.Module) else held[0]
    target.register_hook(lambda g: g)
    handed.append(held)
    after = hooks_of((handed,), {})
    assert any(k not in before and keys for k, (_, _, keys, _) in after.items()), after


# ---- a result compared after the call: read by type, not by its `__class__` -------------------
def test_a_stand_in_for_a_tensor_is_not_compared_as_one():
    from helpers.checks._core.inputs import tensor_close
    from helpers.checks._core.run import CheckFailed
    want, ran = torch.ones(3), []

    class StandIn:
        shape, dtype = want.shape, want.dtype

        @property
        def __class__(self):
            ran.append(True)
            return torch.Tensor

        def to(self, dtype):
            return want.clone()
    with pytest.raises(CheckFailed, match="expected a tensor"):
        tensor_close(StandIn(), want)
    assert not ran
