"""Where an overlap_hooks answer can keep its handles beyond the walk from finish() and its hooks
(helpers/checks/_core/held.py, reach.py): as a dict's keys (`pending[work] = name`), in a list
on each parameter (past the walk's depth from finish(), so the model and its parameters are
walked from too), in a module made at import and reached by `importlib.import_module` or
`sys.modules[...]`, or in a store hung on `builtins` or `torch` at import under a name built at
run time (attributes added since the checks were first imported are walked, and every
attribute of a module made since; fresh.regrade's copy of the course judges by that first
import). Each fails when it keeps an earlier step's handles, and passes cleared
(tests/check_cases.py's form)."""
import builtins
import collections
import importlib
import re
import sys
import types

import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut
from test_checks_held_hooks import KEPT, _average, _hook_each

import helpers.checks  # noqa: F401  (imported first: the stores below are made after it)


def _keyed_by_handle(model, pending, cleared):
    """The hooks keep each handle as a key of `pending` (its parameter's name the value)."""
    names = {p: n for n, p in model.named_parameters()}
    _hook_each(model, lambda p: pending.__setitem__(dist.all_reduce(p.grad, async_op=True),
                                                    names[p]))

    def finish():
        for work in pending:
            work.wait()
        if cleared:
            pending.clear()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "handles as a dict's keys, never cleared", KEPT)
def overlap_hooks_dict_keys_kept(model):
    return _keyed_by_handle(model, {}, False)


@shortcut("check_overlap_hooks", "handles as an OrderedDict's keys, never cleared", KEPT)
def overlap_hooks_ordered_keys_kept(model):
    return _keyed_by_handle(model, collections.OrderedDict(), False)


@other("check_overlap_hooks", "handles as a dict's keys, cleared every step")
def overlap_hooks_dict_keys_cleared(model):
    return _keyed_by_handle(model, {}, True)


def _on_each_parameter(model, cleared):
    """Each parameter keeps a list of its own handles in its `__dict__`."""
    _hook_each(model, lambda p: p.__dict__.setdefault("_handles", []).append(
        dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for p in model.parameters():
            for work in p.__dict__.get("_handles", []):
                work.wait()
            if cleared:
                p.__dict__.get("_handles", []).clear()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "a list of handles on each parameter, never cleared", KEPT)
def overlap_hooks_parameter_lists_kept(model):
    return _on_each_parameter(model, False)


@other("check_overlap_hooks", "a list of handles on each parameter, cleared every step")
def overlap_hooks_parameter_lists_cleared(model):
    return _on_each_parameter(model, True)


# made at import, after the checks were: a module no file holds, and stores on libraries
_MADE = "_held_stores_made_module"
sys.modules.setdefault(_MADE, types.ModuleType(_MADE)).pending = {}
_ON_BUILTINS, _ON_TORCH = "_held_stores" + "_builtins", "_held_stores" + "_torch"
setattr(builtins, _ON_BUILTINS, {})
setattr(torch, _ON_TORCH, {})


@pytest.fixture(autouse=True)
def _stores_emptied():
    """Each case's handles leave the stores when it ends: a later check's scan reads builtins
    (a function's `__builtins__`) and would find a World's handles there."""
    yield
    for store in (sys.modules[_MADE].pending, getattr(builtins, _ON_BUILTINS),
                  getattr(torch, _ON_TORCH)):
        store.clear()


def _kept_in(model, store):
    """The hooks append to `store()[rank]` (looked up by name each time), never cleared."""
    rank = dist.get_rank()
    _hook_each(model, lambda p: store().setdefault(rank, []).append(
        dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in store().get(rank, []):
            work.wait()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "handles in a module made at import, reached by "
          "importlib.import_module", KEPT)
def overlap_hooks_made_module(model):
    return _kept_in(model, lambda: importlib.import_module(_MADE).pending)


@shortcut("check_overlap_hooks", "handles in a module made at import, reached through "
          "sys.modules", KEPT)
def overlap_hooks_made_module_sys_modules(model):
    return _kept_in(model, lambda: sys.modules[_MADE].__dict__["pending"])


@shortcut("check_overlap_hooks", "handles in a dict hung on builtins at import", KEPT)
def overlap_hooks_builtins_store(model):
    return _kept_in(model, lambda: getattr(builtins, _ON_BUILTINS))


@shortcut("check_overlap_hooks", "handles in a dict hung on torch at import", KEPT)
def overlap_hooks_torch_store(model):
    return _kept_in(model, lambda: getattr(torch, _ON_TORCH))


test_case = parametrize_cases(__name__)


def test_a_fresh_import_walks_what_was_set_since_the_first():
    """fresh.regrade imports the course again after every cell ran: what a cell hung on
    builtins after the notebook's import of the checks is still no library's own."""
    from helpers.checks._core import fresh, late
    try:
        with pytest.raises(AssertionError, match=re.escape(KEPT)):
            fresh.regrade("check_overlap_hooks", overlap_hooks_builtins_store)
    finally:
        late._route_changed()       # this copy's route into the engine back, for later tests
