"""What an answer changes in the libraries the checks compute with fails it and is put back, when
the new value is anything the check's later code calls or reads through: a function of the
reader's that claims the harness's `__module__` (only the harness's own code is its stand-in),
or a descriptor (a property added to `torch.Tensor`, whose getter runs when the check reads
`.shape` after the call; one in place of a method), not only a plain callable (patched.py)."""
import threading

import pytest
import torch

from helpers.checks import check_dp_average, check_update_running_stats

SHAPE = torch._C.TensorBase.shape


def _stats(running_mean, running_var, mean, var, n, momentum, unbiased=True):
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * (var * n / (n - 1) if unbiased else var)
    return new_mean, new_var


def _pending_fix(pending):
    """Turns each pending biased running_var into the unbiased one, in place."""
    for new_var, var, n, momentum in pending:
        new_var.add_(momentum * var * (n / (n - 1) - 1))
    pending.clear()


def _verdict(check, answer, *names):
    """The check's result, and whether each (owner, name, original) is the original again."""
    try:
        result = check(answer)
        return result, [vars(owner).get(name) is original for owner, name, original in names]
    finally:
        for owner, name, original in names:
            if original is None:
                vars(owner).get(name) is None or delattr(owner, name)
            else:
                setattr(owner, name, original)


@pytest.mark.parametrize("kind", ["function", "object"])
def test_a_stand_in_claiming_the_harness_module_fails_and_is_put_back(kind):
    original, pending = torch.as_tensor, []

    def as_tensor(*args, **kwargs):
        _pending_fix(pending)
        return original(*args, **kwargs)

    class AsTensor:
        __call__ = staticmethod(as_tensor)

    def answer(running_mean, running_var, mean, var, n, momentum):
        got = _stats(running_mean, running_var, mean, var, n, momentum, unbiased=False)
        pending.append((got[1], var, n, momentum))
        stand_in = as_tensor if kind == "function" else AsTensor()
        target = as_tensor if kind == "function" else AsTensor
        target.__module__ = "helpers.checks.syncbn"     # in the call: the scan saw the truth
        torch.as_tensor = stand_in
        return got

    result, restored = _verdict(check_update_running_stats, answer,
                                (torch, "as_tensor", original))
    assert not result.passed and "replaced torch.as_tensor" in result.message, result.message
    assert restored == [True]


def _shape_fixing_running_var():
    pending = []

    def shape(self):
        if threading.current_thread() is threading.main_thread():
            _pending_fix(pending)
        return SHAPE.__get__(self)

    def answer(running_mean, running_var, mean, var, n, momentum):
        got = _stats(running_mean, running_var, mean, var, n, momentum, unbiased=False)
        pending.append((got[1], var, n, momentum))
        torch.Tensor.shape = property(shape)
        return got
    return answer


def test_a_property_added_to_tensor_fails_a_plain_check():
    result, removed = _verdict(check_update_running_stats, _shape_fixing_running_var(),
                               (torch.Tensor, "shape", None))
    assert not result.passed and "replaced torch.Tensor.shape" in result.message, result.message
    assert removed == [True]


def test_a_property_added_to_tensor_fails_a_world_check():
    kept = []

    def shape(self):
        if kept and threading.current_thread() is threading.main_thread():
            for grads in kept:
                for t in grads:
                    t.div_(len(kept))
            kept.clear()
        return SHAPE.__get__(self)

    def dp_average(grads, comm):
        for t in grads:
            comm.all_reduce(t)          # the sum, never divided in the call
        kept.append(grads)
        torch.Tensor.shape = property(shape)

    result, removed = _verdict(check_dp_average, dp_average, (torch.Tensor, "shape", None))
    assert not result.passed and "replaced torch.Tensor.shape" in result.message, result.message
    assert removed == [True]


def test_a_descriptor_in_place_of_a_method_fails():
    original = vars(torch.Tensor)["split"]

    def answer(*args):
        torch.Tensor.split = property(lambda self: original.__get__(self))
        return _stats(*args)

    result, restored = _verdict(check_update_running_stats, answer,
                                (torch.Tensor, "split", original))
    assert not result.passed and "replaced torch.Tensor.split" in result.message, result.message
    assert restored == [True]


def test_right_answers_still_pass():
    def dp_average(grads, comm):
        for t in grads:
            comm.all_reduce(t)
            t.div_(comm.world)

    assert check_update_running_stats(_stats).passed
    assert check_dp_average(dp_average).passed


@pytest.mark.parametrize("tags", [True, False], ids=["version tags", "names compared"])
def test_a_check_body_end_removes_a_property_added(tags):
    """late.py's comparison at a check body's end (a change made outside the answer's calls)
    judges added names too, by patched.py's rules: where namespaces are told unchanged by their
    version tags, and where every name is compared (a Python without tags)."""
    from helpers.checks._core import late, patched
    spaces, _, copies, tagged = patched.copied()
    torch.Tensor.shape = property(lambda self: SHAPE.__get__(self))
    try:
        changed = late._changed(spaces, copies, tagged if tags else (None, None))
        removed = "shape" not in vars(torch.Tensor)
    finally:
        vars(torch.Tensor).get("shape") is None or delattr(torch.Tensor, "shape")
    assert "torch.Tensor.shape" in changed and removed
