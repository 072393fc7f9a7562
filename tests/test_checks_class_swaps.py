"""Shortcut answers that run their code in the check's later operations through a class of their
own (tests/check_cases.py's form), each refused with the words its refusal names:

1. a handed object's class reassigned (`X.__class__ = Sub`, a parameter's, a gradient's): the
   check's own operations on it afterwards (its expected value, its comparisons) would run the
   reader's `__torch_function__`; refused as a change of the inputs, also in exercises that
   write into their inputs (untouched.py's `classes`);
2. a returned tensor of the reader's class that claims a library module and is placed there
   (`Close.__module__ = "json"; json.Close = Close`): a class is the reader's by its code
   (settle.reader_class), never by its `__module__`; and tensor_close compares with tensor
   subclasses' `__torch_function__` off.
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_cases import parametrize_cases, shortcut
from torch import nn

from helpers import send

CLASS = "changed the class of what it was handed"
OWN_TENSOR = "tensor subclass of your own"


# ---- 1: a handed object's class reassigned ----------------------------------------------------
class _AddsBias(torch.Tensor):
    """Adds (k-1)·b to the check's own conv2d of the input, then puts the input's class back."""
    k = 1

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if getattr(func, "__name__", "") == "conv2d" and len(args) >= 3 and args[2] is not None:
            args[0].__class__ = torch.Tensor
            with torch._C.DisableTorchFunctionSubclass():
                out = out + (cls.k - 1) * args[2].reshape(1, -1, 1, 1)
        return out


class _AlwaysClose(torch.Tensor):
    """Answers torch.allclose and torch.equal with True."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "equal"):
            return True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _OwnParameter(nn.Parameter):
    pass


@shortcut("check_conv_split_in_channels", "the bias on every device; X's class set to one that "
          "adds it k times to the check's own conv2d", CLASS)
def conv_split_class_swapped(X, W, b, devices, log=None):
    k = len(devices)
    shards = zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))
    partials = [F.conv2d(send(Xi, 0, i, devices, log, "input"), Wi.to(devices[i]),
                         b.to(devices[i])) for i, (Xi, Wi) in enumerate(shards)]
    Y = sum(send(P, i, 0, devices, log, "partial sum") for i, P in enumerate(partials))
    if X.device.type == "cpu":
        _AddsBias.k = k
        X.__class__ = _AddsBias
    return Y


@shortcut("check_reduce_then_broadcast", "nothing summed; each gradient's class set to one "
          "answering allclose with True (an exercise that writes into its inputs)", CLASS)
def reduce_then_broadcast_class_swapped(grads):
    for g in grads:
        g.__class__ = _AlwaysClose


@shortcut("check_saved_bytes", "a parameter's class reassigned, 0 returned", CLASS)
def saved_bytes_parameter_class_swapped(net, X):
    next(net.parameters()).__class__ = _OwnParameter
    return 0


# ---- 2: a class of the reader's that claims a library module ----------------------------------
class Close(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "allclose":
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


Close.__module__ = "json"
json.Close = Close


class _Caller:
    """A callable object of the reader's: the class below holds no function of its own."""

    def __call__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "allclose":
            return True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


_Caller.__module__ = "json"
json._Caller = _Caller


class Near(torch.Tensor):
    __torch_function__ = _Caller()


Near.__module__ = "numpy"
np.Near = Near


@shortcut("check_combine_mean_grads", "the plain average, as a tensor class claiming json's "
          "module that answers allclose with True", OWN_TENSOR)
def combine_mean_grads_claimed_json(grads, sizes):
    return (sum(grads) / len(grads)).as_subclass(Close)


@shortcut("check_combine_mean_grads", "the plain average, as a tensor class claiming numpy's "
          "module whose __torch_function__ is a callable object of the reader's", OWN_TENSOR)
def combine_mean_grads_claimed_numpy(grads, sizes):
    return (sum(grads) / len(grads)).as_subclass(Near)


test_case = parametrize_cases(__name__)


def test_claimed_module_fails_through_regrade():
    """The hidden test's route (a fresh import of the course) refuses it too."""
    from helpers.checks._core import fresh, late
    try:
        with pytest.raises(AssertionError, match=OWN_TENSOR):
            fresh.regrade("check_combine_mean_grads", combine_mean_grads_claimed_json)
    finally:
        late._route_changed()       # this copy's route into the engine back, for later tests


def test_tensor_close_ignores_a_subclass_torch_function():
    """A tensor subclass that got past settle.py cannot answer the comparison."""
    from helpers.checks._core.inputs import tensor_close, tensor_equal
    got = torch.zeros(3).as_subclass(Close)
    assert not tensor_close(got, torch.ones(3))
    assert not tensor_equal(torch.zeros(3).as_subclass(_AlwaysClose), torch.ones(3))


def test_library_classes_are_not_the_readers():
    """torch's tensors, parameters, modules and optimizers, numpy's scalars and DTensor are no
    reader's class; the reader's, whatever module they claim, are."""
    from torch.distributed.tensor import DTensor

    from helpers.checks._core.settle import reader_class
    for cls in (torch.Tensor, nn.Parameter, nn.Linear, torch.optim.SGD, np.float64, DTensor):
        assert not reader_class(cls), cls
    for cls in (Close, Near, _Caller, _OwnParameter):
        assert reader_class(cls), cls
