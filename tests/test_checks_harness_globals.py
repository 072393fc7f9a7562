"""The harness's own state, held in module globals, is what its verdicts trust: an answer that
reaches a harness module by a name built at run time must not change it in place. Live state is
held as functions' default arguments (guard.py refuses the reader's code reading them while an
answer runs), the tables read while answers run are compared around each call (tables.py), and
stubs.py writes back only the original code it saved itself."""
import importlib
import math
import sys

import pytest
import torch
from check_cases import not_grading, quiet  # noqa: F401 (a fixture)

import helpers
import helpers.checks
from helpers.checks._core import references, stubs, tables
from helpers.checks._core.run import ReferenceUsed

_PLAIN = helpers.activation_bytes_per_token.__code__
_DEFAULTS = "__def" + "aults__"   # built: the scan before the call refuses the name itself


def _slip(width, heads, seq, tp=1, sp=False, recompute="none", dtype_bytes=4, flash=True,
          dropout=False, ln_stats=True):
    """activation_bytes_per_token with 5as/h not divided by t (the natural slip)."""
    h, a, s, t = width, heads, seq, tp
    if recompute == "full":
        return 2 * h / (t if sp else 1)
    attn = 0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return h * (34 + attn) / t
    return h * (10 + 24 / t + attn)


def activation_bytes_slip(width, heads, seq, tp, sp, recompute):
    return _slip(width, heads, seq, tp, sp, recompute)


def _forge(state):
    """Put the slip's code where the block keeps the course function's original."""
    for key, entry in list(state["swapped"].items()):
        if getattr(entry[3], "name", "") == "activation_bytes_per_token":
            state["swapped"][key] = (entry[0], _slip.__code__, *entry[2:])


def activation_bytes_swapped_by_attribute(width, heads, seq, tp, sp, recompute):
    """The hunter's case: the saved original found as a module attribute of stubs.py."""
    st = importlib.import_module("helpers.checks._core." + "stu" + "bs")
    for entry in getattr(st, "_SWA" + "PPED").values():
        if getattr(entry[4], "name", "") == "activation_bytes_per_token":
            entry[1] = _slip.__code__
    return _slip(width, heads, seq, tp, sp, recompute)


def activation_bytes_swapped_by_defaults(width, heads, seq, tp, sp, recompute):
    """The same, through the default argument that holds stubs.py's state now."""
    st = importlib.import_module("helpers.checks._core." + "stu" + "bs")
    _forge(getattr(getattr(st, "_h" + "it"), _DEFAULTS)[0])
    return _slip(width, heads, seq, tp, sp, recompute)


_WORDS = {"activation_bytes_swapped_by_attribute": "_SWAPPED",
          "activation_bytes_swapped_by_defaults": "__defaults__ of the grader's _hit"}


@pytest.mark.parametrize("answer", [activation_bytes_swapped_by_attribute,
                                    activation_bytes_swapped_by_defaults])
def test_a_saved_original_put_there_by_the_answer_fails_and_never_reaches_the_course(answer):
    """The harness writes the saved original back into the course's function at the block's
    end, and the check's own reference calls run it: an answer that put its slip there must
    fail, leave the course's function as it was, and leave the plain slip failing."""
    try:
        result = quiet(helpers.checks.check_activation_bytes, answer)
        assert not result.passed and _WORDS[answer.__name__] in result.message, result
        assert helpers.activation_bytes_per_token.__code__ is _PLAIN
        assert not quiet(helpers.checks.check_activation_bytes, activation_bytes_slip).passed
    finally:
        helpers.activation_bytes_per_token.__code__ = _PLAIN


def test_the_block_writes_back_only_the_original_it_saved():
    """stubs._restore: an entry replaced while the block ran (by whatever route) fails the block,
    and the course's function gets the code the block saved, not the entry's."""
    fn = helpers.activation_bytes_per_token
    ref = references.Reference("activation_bytes_per_token", fn)
    with pytest.raises(ReferenceUsed, match="put back while the check ran"):
        with stubs.blocked([ref], "activation_bytes_per_token"):
            assert fn.__code__ is not _PLAIN
            _forge(stubs._hit.__defaults__[0])
    assert fn.__code__ is _PLAIN
    assert not stubs._hit.__defaults__[0]["swapped"]


def _fake(it):
    return 0.0


def fit_two_points_kept_copy(n, t):
    """The hunter's case: the line through the first and last point, math.fsum replaced and the
    same name put into patched.py's kept copy of math's namespace (through its defaults)."""
    s = (t[-1] - t[0]) / (n[-1] - n[0])
    pm = importlib.import_module("helpers.checks._core." + "pat" + "ched")
    cache = getattr(getattr(pm, "_spa" + "ces"), _DEFAULTS)[0]
    for i, space in enumerate(cache["spaces"]):
        if space[1] is math:
            setattr(math, "fs" + "um", _fake)
            cache["copies"]["held"][i]["fs" + "um"] = _fake
    return t[0] - s * n[0], 1 / s


def test_a_kept_copy_poisoned_through_defaults_fails():
    """patched.py's kept copies are a default argument: the answer may not read it."""
    fsum = math.fsum
    import torch._subclasses.schema_check_mode  # noqa: F401 (a first check's lazy import)
    try:
        result = quiet(helpers.checks.check_fit_latency_bandwidth, fit_two_points_kept_copy)
        assert not result.passed and "the grader's _spaces" in result.message, result
        assert math.fsum is fsum
    finally:
        math.fsum = fsum


_ARMED = []


def shard_sizes_switch_unguarded(n, k):
    """The hunter's case: call 1 empties switches.py's list of torch modules (through its
    defaults) and answers with divmod; later calls measure under an unguarded switch."""
    if not _ARMED:
        sw = importlib.import_module("helpers.checks._core.swi" + "tches")
        getattr(getattr(sw, "_torch_" + "spaces"), _DEFAULTS)[-1]["spaces"] = ()
        _ARMED.append(True)
        q, r = divmod(n, k)
        return [q + 1] * r + [q] * (k - r)
    with getattr(torch._C, "_Disable" + "TorchDispatch")():
        return [len(s) for s in torch.arange(n).tensor_split(k)]


def shard_sizes_measured(n, k):
    return [len(s) for s in torch.arange(n).tensor_split(k)]


def test_the_switches_list_emptied_through_defaults_fails():
    result = quiet(helpers.checks.check_shard_sizes, shard_sizes_switch_unguarded)
    assert not result.passed and "the grader's _torch_spaces" in result.message, result
    later = quiet(helpers.checks.check_shard_sizes, shard_sizes_measured)
    assert not later.passed and "built and split a tensor" in later.message, later


def shard_sizes_words_changed(n, k):
    """A table of the harness's words, read while answers run, changed in place."""
    waits = importlib.import_module("helpers.checks._core.wa" + "its")
    getattr(waits, "_COMM" + "_FIX")["send"] = "nothing to do"
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def test_a_read_only_table_changed_in_place_fails_and_is_put_back():
    from helpers.checks._core import waits
    before = dict(waits._COMM_FIX)
    result = quiet(helpers.checks.check_shard_sizes, shard_sizes_words_changed)
    assert not result.passed and "waits._COMM_FIX" in result.message, result
    assert waits._COMM_FIX == before


def _containers():
    """(module under helpers.checks, name, object) of every mutable container a loaded harness
    module binds."""
    prefix = "helpers.checks"
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for key, value in list(vars(module).items()):
            if type(value) in (dict, list, set, bytearray) and not key.startswith("__"):
                yield name[len(prefix) + 1:], key, value


def test_a_stubbed_course_functions_defaults_stay_readable():
    """A course function whose code is the harness's stub (guard.py's refusal of a harness
    function's defaults is for the harness's own functions, not those it stubs)."""
    fn = helpers.activation_bytes_per_token
    ref = references.Reference("activation_bytes_per_token", fn)
    with stubs.blocked([ref], "activation_bytes_per_token"):
        result = quiet(helpers.checks.check_shard_sizes, _reads_defaults)
    assert result.passed, result


def _reads_defaults(n, k):
    assert getattr(helpers.activation_bytes_per_token, "__def" + "aults__")[0] == 1
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def test_every_mutable_module_global_of_the_harness_is_compared_or_listed():
    """A maintainer who binds a new dict, list or set as a harness module's global must either
    hold it as a default argument (live state), add it to tables.READ_ONLY (compared around each
    call) or to tables.LIVE with the reason it may stay (this test fails until then)."""
    loaded = {m: vars(sys.modules[f"helpers.checks.{m}"]) for m, _ in (*tables.READ_ONLY,
              *tables.LIVE) if f"helpers.checks.{m}" in sys.modules}   # (a module yet to come)
    checked = {id(loaded[m].get(n)) for m, n in tables.READ_ONLY if m in loaded}
    listed = {id(loaded[m].get(n)) for m, n in tables.LIVE if m in loaded}
    unlisted = [f"{m}.{n}" for m, n, v in _containers()
                if id(v) not in checked and id(v) not in listed]
    assert not unlisted, f"mutable module globals neither compared nor listed: {unlisted}"
    assert all(type(why) is str and why for why in tables.LIVE.values())
    bound = {(m, n) for m, n, _ in _containers()}
    stale = [(m, n) for m, n in (*tables.READ_ONLY, *tables.LIVE)
             if (m, n) not in bound and f"helpers.checks.{m}" in sys.modules]
    assert not stale, f"listed, but no such mutable global: {stale}"


def _dp_average_asking_signatures(grads, comm):
    """A right answer that asks torch's signatures of the calls it makes (a version check)."""
    import inspect

    import torch.distributed as dist
    local = "use_local_synchronization" in inspect.signature(dist.new_group).parameters
    kw = {"async_op": False} if "async_op" in inspect.signature(dist.all_reduce).parameters \
        else {}
    world, rank, tp = dist.get_world_size(), dist.get_rank(), dist.get_world_size() // comm.world
    mine = [r for r in range(world) if r % tp == rank % tp]
    group = dist.new_group(mine, use_local_synchronization=True) if local else None
    for g in grads:
        dist.all_reduce(g, group=group, **kw)
        g /= comm.world


def test_a_stand_in_s_signature_is_torch_s_and_readable():
    """inspect.signature of a played torch call (a right answer's version check) reads torch's
    parameters, not the harness's state: it passes, and sees use_local_synchronization."""
    result = quiet(helpers.checks.check_dp_average, _dp_average_asking_signatures)
    assert result.passed, result.message
