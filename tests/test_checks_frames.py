"""Reading the check, for every check of the course: while the answer runs, no frame of the
check holds its expected result, and the guard refuses an answer that reaches the running
program (its frames, or the garbage collector's view of the check's objects).

The first test switches the guard off (as a ctypes or C-extension walk would get past it,
book/teachers.md) and runs each check's worked answer wrapped in a spy: the spy walks every
thread's frames in helpers/checks and keeps every tensor there; after the check, none of them may
equal (same shape, same values) what the answer returned or wrote into its inputs. A check that
computed its expected value before calling the answer fails here, whatever the value is named.
The second gives every check an answer that first walks its frames (or calls gc.get_objects()),
catches what that raises, then returns the worked answer's result: the guard must still fail it.
"""
import gc
import importlib
import pathlib
import sys
import types

import pytest
import torch
from check_cases import CASES, parametrize_cases, shortcut
from torch.utils._python_dispatch import _disable_current_modes

import helpers
import helpers.checks
from helpers.checks._core import REGISTRY, guard

TESTS = pathlib.Path(__file__).resolve().parent
for path in sorted(TESTS.glob("test_checks_*.py")):
    if path.stem not in ("test_checks_registry", "test_checks_frames", "test_checks_hunt"):
        importlib.import_module(path.stem)     # fills CASES with every check's worked answer

CHECKS_DIR = pathlib.Path(helpers.checks.__file__).resolve().parent
CHECKS = sorted(n for n in dir(helpers.checks) if n.startswith("check_") and n in REGISTRY
                and CASES.get(n, {}).get("worked"))


def _is_check_code(code):
    path = pathlib.Path(code.co_filename)
    return path.parent == CHECKS_DIR


def _tensors(obj, depth=0, seen=None):
    """The tensors in obj, looking into lists, tuples, dicts and modules' buffers 3 deep."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item, depth + 1, seen)]
    return []


def _plain(obj):
    """A number, or a list/tuple/dict of numbers and names, as a value to compare (None for
    anything else, and for small whole numbers, which a check holds by chance: 2 ranks)."""
    if isinstance(obj, bool):
        return None
    if isinstance(obj, (int, float)):
        return ("n", float(obj)) if abs(obj) >= 100 or obj != int(obj) else None
    if isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        items = [(k, _plain(v) or _leaf(v)) for k, v in sorted(obj.items())]
        return ("d", tuple(items)) if all(v is not None for _, v in items) else None
    if isinstance(obj, (list, tuple)) and len(obj) >= 2:
        items = [_plain(v) or _leaf(v) for v in obj]
        return ("s", tuple(items)) if all(v is not None for v in items) else None
    return None


def _leaf(obj):
    if isinstance(obj, (int, float, str)):
        return ("l", obj)
    if isinstance(obj, (list, tuple)):
        items = [_leaf(v) for v in obj]
        return ("s", tuple(items)) if all(v is not None for v in items) else None
    return None


def _held_plain(value, where, given):
    """(where, value) for value and, one level down, its items: the plain values a frame
    holds."""
    out = []
    for item in [value, *(value.values() if isinstance(value, dict) else
                          value if isinstance(value, (list, tuple)) else [])]:
        key = _plain(item) if id(item) not in given else None
        if key is not None:
            out.append((where, key))
    return out


def _held_by_checks(args):
    """A copy of every tensor a frame of helpers/checks holds now, in any thread, with where it
    is (copied now: another rank may change its own inputs later); and every plain value
    (numbers, lists of them) it holds, but for the answer's own arguments."""
    held, plain = [], []
    given = {id(args)} | {id(a) for a in _flat(args)}
    for top in sys._current_frames().values():
        f = top
        while f is not None:
            if _is_check_code(f.f_code):
                for name, value in dict(f.f_locals).items():
                    where = f"{f.f_code.co_name}:{name}"
                    held += [(where, t) for t in _tensors(value)]
                    plain += _held_plain(value, where, given)
            f = f.f_back
    with _disable_current_modes():
        return [(where, t, t.detach().clone()) for where, t in held if not _is_fake(t)], plain


def _flat(obj, depth=0):
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) \
        else []
    out = list(items)
    if depth < 2:
        for item in list(out):
            out += _flat(item, depth + 1)
    return out


def _close(a, b):
    if a == b:
        return True
    if (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2
            and a[0] == b[0] == "n"):
        return abs(a[1] - b[1]) <= 1e-6 * max(abs(a[1]), abs(b[1]))
    return False


def _is_fake(t):
    return "Fake" in type(t).__name__ or t.device.type == "meta"


def _same(a, b):
    """a and b hold the same values (floats: as close as a check accepts, any float dtype)."""
    if a.shape != b.shape or _is_fake(a) or _is_fake(b):
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() and b.is_floating_point():
        a, b = a.double(), b.double()
        return bool(torch.allclose(a, b, rtol=1e-4, atol=0) and a.abs().sum() > 0)
    if a.dtype != b.dtype or a.numel() < 4:
        return False                     # a small count or flag equal by chance
    return bool(torch.equal(a, b))


def _snapshot(obj):
    """(tensor, a copy of its values) for the real tensors in obj, unseen by the check."""
    with _disable_current_modes():
        return [(t, t.detach().clone()) for t in _tensors(obj) if not _is_fake(t)]


# the spy reaches its tools by names computed at run time, which the check's static scan cannot
# follow (it would rightly refuse a frame walk or a harness import seen in the answer's code)
TOOLS = types.ModuleType("frame_spy_tools")
HELD, SNAPSHOT = "held_" + "by_checks", "snap" + "shot"
setattr(TOOLS, HELD, _held_by_checks)
setattr(TOOLS, SNAPSHOT, _snapshot)


@pytest.fixture
def guard_off(monkeypatch):
    """The audit hook refuses nothing in any thread (its judge says yes to everything)."""
    monkeypatch.setattr(guard, "_judge", lambda *args: None)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


@pytest.mark.parametrize("name", CHECKS)
def test_no_check_frame_holds_the_result_while_the_answer_runs(name, guard_off):
    worked = CASES[name]["worked"][0].fn
    calls = []

    def spy(*args, **kwargs):
        held = getattr(TOOLS, HELD)([args, kwargs])
        before = getattr(TOOLS, SNAPSHOT)([args, kwargs])
        out = worked(*args, **kwargs)
        calls.append((held, out, args, kwargs, before))
        return out
    spy.__name__ = worked.__name__
    result = getattr(helpers.checks, name)(spy)
    assert calls, f"{name}: the answer was not called"
    assert result.passed, f"{name}: the worked answer, spied on, did not pass: {result}"
    found, earlier, earlier_plain = [], [], []
    # what any call was given is an input, not an expected value (another rank's shard)
    inputs = [old for *_, before in calls for _, old in before]
    for (held, plain), out, args, kwargs, before in calls:
        # a value equal to an earlier call's result is a leftover of that call (its `got`), not
        # this call's expected value read in advance
        result_value = _plain(out) if not isinstance(out, torch.Tensor) else None
        if result_value is not None:
            found += [where for where, value in plain if _close(value, result_value)
                      and not any(_close(value, e) for e in earlier_plain)]
            earlier_plain.append(result_value)
        given = {id(t) for t in _tensors([args, kwargs])}
        written = [t for t, old in before if not torch.equal(t.detach().cpu(), old.cpu())]
        results = [t for t in _tensors(out) if id(t) not in given] + written
        for where, h, value in held:
            if id(h) in given or any(_same(value, e) for e in earlier + inputs):
                continue
            found += [where for r in results if _same(value, r)]
        earlier += [r.detach().clone() for r in results if not _is_fake(r)]
    assert not found, (f"{name}: while the answer ran, the check already held its result in "
                       f"{sorted(set(found))}: compute it after the call")


def _walk_frames():
    f = getattr(sys, "_get" + "frame")(1)     # computed names: past the static scan
    while f is not None:
        f = getattr(f, "f_" + "back")


def _all_objects():
    getattr(gc, "get_" + "objects")()


@pytest.mark.parametrize("peek", [_walk_frames, _all_objects], ids=["frames", "gc"])
@pytest.mark.parametrize("name", CHECKS)
def test_the_guard_refuses_reading_the_running_program(name, peek, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    worked = CASES[name]["worked"][0].fn

    def answer(*args, **kwargs):
        try:
            peek()
        except BaseException:            # an answer that hides the refusal
            pass
        return worked(*args, **kwargs)
    result = getattr(helpers.checks, name)(answer)
    assert result.status == "failed", f"{name}: an answer calling {peek.__name__} passed"
    assert "inspects the running program" in result.message, result.message


# ---- computing after the call opens one door: an answer that edits its inputs edits the
# expected value too. The checks keep a copy of the inputs and refuse that.
CHANGED = "changed its input"


@shortcut("check_attention_by_heads", "zeroes Wo in place, returns zeros", CHANGED)
def attention_zeroed(X, Wq, Wk, Wv, Wo, heads, devices, log):
    with torch.no_grad():
        Wo.zero_()
    return (X @ Wq @ Wo) * 0


@shortcut("check_conv_split_in_channels", "zeroes W and b in place, returns zeros", CHANGED)
def conv_zeroed(X, W, b, devices, log=None):
    with torch.no_grad():
        W.zero_()
        b.zero_()
    return torch.nn.functional.conv2d(X, W, b)


@shortcut("check_accumulated_step", "zeroes X in place: the step is then b's only", CHANGED)
def accumulated_zeroed(net, params, X, y, num_micro, lr):
    with torch.no_grad():
        X.zero_()
    for Xm, ym in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        torch.nn.functional.cross_entropy(net(Xm, params), ym, reduction="sum").backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / len(X)
            p.grad = None


test_case = parametrize_cases(__name__)
