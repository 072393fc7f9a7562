"""Default arguments changed in place: a function's `__kwdefaults__` dict (or a mutable item of
its `__defaults__`, or a partial's keywords) changed without a new object raises no audit event
and keeps every binding, yet the check's reference built after the call takes the answer's
default (`AdamW(...)` maximizing). patched.py and late.py compare their contents with the
bindings (defaults.py), put them back, and fail the answer naming the function."""
import functools
import importlib
import os
import weakref

import pytest
import torch
from check_cases import escape_young, other, parametrize_cases, shortcut

_KW = "__kw" + "defaults__"                 # a name the scan cannot read
_ACT = importlib.import_module("helpers.act" + "ivations")
_ADAMW = torch.optim.AdamW.__init__
_ORIGINALS = [(f, dict(getattr(f, _KW))) for f in (_ADAMW, _ACT.saved_tensor_bytes)]


@pytest.fixture(autouse=True)
def _put_back():
    """Whatever a test's trick did to the defaults, they are the originals again after it."""
    yield
    for f, saved in _ORIGINALS:
        kw = getattr(f, _KW)
        kw.clear()
        kw.update(saved)


def _owners(params, world):
    load, owner = [0] * world, {}
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = load.index(min(load))
        owner[i], load[r] = r, load[r] + params[i].numel()
    return owner


# ---- torch's optimizer: the reference AdamW built after the call --------------------------------
@shortcut("check_zero1_optimizer", "gradient ascent (maximize=True); AdamW's keyword default "
          "made True in place", ["AdamW.__init__ (its __kwdefaults__)", "put back"])
def zero1_optimizer_maximize_default(params, rank, world, lr):
    getattr(torch.optim.AdamW.__init__, _KW)["maximize"] = True
    owner = _owners(params, world)
    mine = [p for i, p in enumerate(params) if owner[i] == rank]
    return torch.optim.AdamW(mine, lr=lr, maximize=True)


@other("check_zero1_optimizer", "AdamW's default changed and put back inside the call")
def zero1_optimizer_default_restored(params, rank, world, lr):
    kw = getattr(torch.optim.AdamW.__init__, _KW)
    kw["maximize"] = True
    kw["maximize"] = False
    owner = _owners(params, world)
    return torch.optim.AdamW([p for i, p in enumerate(params) if owner[i] == rank], lr=lr)


# ---- the course's function the check measures with after the call ------------------------------
def _saved_without(f, x, skip):
    """Bytes of the distinct storages autograd saves in f(x), those of `skip` left out."""
    keys = {t.untyped_storage().data_ptr() for t in (*skip, *f.parameters())}
    seen = set()
    total = [0]

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in keys and key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(x)
    return total[0]


@shortcut("check_saved_bytes_of_call", "the input's storage left out; the course's "
          "saved_tensor_bytes made to leave it out too (its `params` default)",
          "saved_tensor_bytes (its __kwdefaults__)")
def saved_bytes_of_call_input_left_out(f, x):
    mod = importlib.import_module("helpers.act" + "ivations")
    getattr(getattr(mod, "saved_tensor_" + "bytes"), _KW)["params"] = (x,)
    return _saved_without(f, x, (x,))


test_case = parametrize_cases(__name__)


# ---- outside the answer's calls: a weakref callback while the check judges ---------------------


def test_default_changed_after_the_call_fails_the_body():
    """A right answer that leaves a weakref callback changing AdamW's keyword default while the
    check judges it (late.py's comparison at the body's end): failed, the default put back."""
    from helpers.checks import check_rank_loss

    def flip(ref):
        getattr(torch.optim.AdamW.__init__, _KW)["maximize"] = True

    def rank_loss(losses, global_batch, world_size):
        escape_young(weakref.ref(losses, flip))
        return losses.sum() * world_size / global_batch
    result = check_rank_loss(rank_loss)
    assert result.status == "failed" and "(its __kwdefaults__)" in result.message, result
    assert getattr(_ADAMW, _KW)["maximize"] is False


# ---- what defaults.py holds and puts back ------------------------------------------------------
def test_held_defaults_contents_compared_and_put_back():
    """Every kind of default container of a watched namespace's functions is held and, changed in
    place, named and put back as the same object; a mutable default that is a module global (a
    library's state kept there) is left out."""
    from helpers.checks._core import defaults

    state = []
    space = {"state": state, "__name__": "torch.fake"}
    source = ("def f(a, b=[1], c=state, *, d=2):\n    return a\n"
              "def p(x, *, e=1):\n    return x\n")
    # compiled under a library's file name: not the reader's code, so judged
    exec(compile(source, os.path.join(os.path.dirname(torch.__file__), "fake.py"), "exec"), space)
    g, p = space["f"], space["p"]

    class K:
        m = staticmethod(g)
    part = functools.partial(print, sep="")

    def mine(x, *, z=1):              # the reader's own: not judged (guard.py's rule)
        return x
    held = defaults.held([("torch.fake", {"g": g, "part": part, "mine": mine}),
                          ("torch.fake.K", {"m": K.__dict__["m"], "w": property(p)})])
    objects = [obj for _, obj in held]
    assert any(obj is g.__kwdefaults__ for obj in objects)
    assert any(obj is g.__defaults__[0] for obj in objects)
    assert any(obj is p.__kwdefaults__ for obj in objects)
    assert any(obj is part.keywords for obj in objects)
    assert not any(obj is state or obj is mine.__kwdefaults__ for obj in objects)
    kept = defaults.copy(held)
    assert defaults.changed(held, kept) == []
    kw, items, keywords = g.__kwdefaults__, g.__defaults__[0], part.keywords
    kw["d"], items[0], keywords["sep"] = 3, 5, "-"
    state.append(1)
    assert len(defaults.changed(held, kept)) == 3
    assert g.__kwdefaults__ is kw and kw == {"d": 2} and items == [1] and keywords == {"sep": ""}
