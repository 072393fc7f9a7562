"""The harness looks names up only in dicts whose keys are all exact strs: a key of the reader's
class whose `__hash__` copies a name's would have each lookup of that name run its `__eq__`
inside the harness (after a World's ranks end, while the watched libraries are compared after a
call, under the guard's off switch). The answer's globals holding one are refused before
anything reads them and after each call; one put into a watched library namespace or into
`sys.modules` fails the answer and is taken out unlooked-up (keys.py). Each shortcut here fixes
a wrong result (or reads the running program) from such a key; each must fail."""
import builtins
import statistics
import sys
import textwrap
import threading

import numpy as np
import pytest
from check_cases import quiet

import helpers.checks

_SPLIT, _ARANGE = np.array_split, np.arange    # numpy's own, bound before any check
_SPACES = (vars(statistics), vars(builtins), sys.modules)


@pytest.fixture(autouse=True)
def no_key_left(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    yield
    for space in _SPACES:       # where the harness left a key (without the fix): taken out
        if any(type(k) is not str for k in dict.keys(space)):
            items = list(dict.items(space))
            kept = [(k, v) for k, v in items if type(k) is str]
            _LEFT.append(items)
            _CLEAR(space)           # (no builtin looked up until refilled: builtins' own)
            _UPDATE(space, kept)


_LEFT = []
_CLEAR, _UPDATE = dict.clear, dict.update


def _answer(source, name, **names):
    """The function `name` that `source` defines, in a module of its own (a plain dict of
    globals holding `names`), as a reader's cell would."""
    g = {"__name__": f"answer_{name}", "__builtins__": builtins, **names}
    exec(compile(textwrap.dedent(source), f"<answer {name}>", "exec"), g)
    return g[name], g


class Colliding:
    """A key whose hash is a name's: every lookup of that name in its dict runs `__eq__`,
    which hands what the answer left in `pending` to `fix` (then empties it)."""

    def __init__(self, name, pending, fix):
        self.hash, self.pending, self.fix = hash(name), pending, fix

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        if self.pending and self.fix(list(self.pending)):
            self.pending.clear()
        return False

    def startswith(self, prefix):     # what the harness asked of a global's name
        return False

    def split(self, sep=None):
        return [""]


def _divide(ranks, world=None):
    """Each rank's summed gradients divided by the number of ranks, once all have returned
    (on the main thread: after the World ended)."""
    world = world or len(ranks)
    main = threading.current_thread() is threading.main_thread()
    if len(ranks) != world or world < 2 or not main:
        return False
    for grads in ranks:
        for t in grads:
            t.div_(world)
    return True


# dp_average's wrong answer: the sum of the ranks' gradients, never divided.
SUMMED = """
def dp_average(grads, comm):
    for t in grads:
        comm.all_reduce(t)
    PENDING.append(grads)
"""


def test_a_key_in_the_globals_is_refused_on_a_world_check():
    pending = []
    answer, g = _answer(SUMMED, "dp_average", PENDING=pending)
    g[Colliding("int", pending, _divide)] = None     # looked up after the World ended
    result = quiet(helpers.checks.check_dp_average, answer)
    assert not result.passed and "keyed by names" in result.message, result


SUMMED_ADDING_A_KEY = """
def dp_average(grads, comm):
    for t in grads:
        comm.all_reduce(t)
    PENDING.append(grads)
    stand_in = G.pop("int")         # the key ahead of the name in the table: probed first
    G[Key("int", PENDING, lambda ranks: divide(ranks, comm.world))] = None
    G["int"] = stand_in
"""


def test_a_key_the_ranks_add_to_the_globals_fails_the_answer():
    pending = []
    answer, g = _answer(SUMMED_ADDING_A_KEY, "dp_average", PENDING=pending, Key=Colliding,
                        divide=_divide)
    g["G"] = g
    result = quiet(helpers.checks.check_dp_average, answer)
    assert not result.passed and "not a str" in result.message, result


class Measuring:
    """A global's key whose `startswith` measures a numpy split from the check's own frame."""
    cache = {}

    def __hash__(self):
        return hash("measuring")

    def __eq__(self, other):
        return False

    def startswith(self, prefix):
        frame = getattr(sys, "_get" + "frame")(1)
        while frame is not None and frame.f_code.co_name != "check_shard_sizes":
            frame = frame.f_back
        if frame is not None:
            n, k = frame.f_locals["n"], frame.f_locals["k"]
            Measuring.cache[n, k] = [len(s) for s in _SPLIT(_ARANGE(n, dtype=np.int8), k)]
        return True


CACHED = """
def shard_sizes(n, k):
    return list(CACHE[n, k])
"""


def test_a_key_in_the_globals_is_refused_on_a_plain_check():
    answer, g = _answer(CACHED, "shard_sizes", CACHE=Measuring.cache)
    g[Measuring()] = None
    result = quiet(helpers.checks.check_shard_sizes, answer)
    assert not result.passed and "keyed by names" in result.message, result


def _unbias(items):
    for new_var, var, n, momentum in items:
        new_var.add_(momentum * var * (n / (n - 1) - 1))
    return True


# update_running_stats's wrong answer (the biased variance), planting a key in SPACE.
BIASED_PLANTING = """
def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    new_var = (1 - momentum) * running_var + momentum * var
    SPACE[Key(NAME, PENDING, unbias)] = None     # (its insertion compares: nothing pending)
    PENDING.append((new_var, var, n, momentum))
    return (1 - momentum) * running_mean + momentum * mean, new_var
"""


@pytest.mark.parametrize("space, name", [(statistics, "mean"), (builtins, "divmod")])
def test_a_key_put_into_a_library_namespace_fails_the_answer(space, name):
    pending = []
    answer, _ = _answer(BIASED_PLANTING, "update_running_stats", PENDING=pending,
                        SPACE=vars(space), Key=Colliding, NAME=name, unbias=_unbias)
    result = quiet(helpers.checks.check_update_running_stats, answer)
    assert not result.passed and f"into {space.__name__}" in result.message, result
    assert all(type(k) is str for k in dict.keys(vars(space)))      # taken out


# A right answer that puts keys colliding with every module's name into sys.modules.
RIGHT_PLANTING_MODULES = """
def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    for module in [k for k in sys.modules if type(k) is str]:
        sys.modules[Key(module, RAN)] = sys
    RAN.append("returned")
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var * n / (n - 1))
"""


class Counting(Colliding):
    """A key that notes the calls of its methods made after the answer returned."""

    def __init__(self, name, ran):
        super().__init__(name, ran, None)

    def __eq__(self, other):
        if "returned" in self.pending:
            self.pending.append("ran")
        return False

    def split(self, sep=None):
        return self.__eq__(sep) or [""]

    __hash__ = Colliding.__hash__


def test_a_key_put_into_sys_modules_fails_the_answer_and_never_runs():
    ran = []
    answer, _ = _answer(RIGHT_PLANTING_MODULES, "update_running_stats", RAN=ran, Key=Counting,
                        sys=sys)
    result = quiet(helpers.checks.check_update_running_stats, answer)
    assert not result.passed and "sys.modules" in result.message, result
    assert "ran" not in ran
    assert all(type(k) is str for k in dict.keys(sys.modules))


class FrameReading:
    """A key of a helper's globals whose `__eq__` reads the running program's frames."""
    read = []

    def __hash__(self):
        return hash("__name__")

    def __eq__(self, other):
        frames = getattr(sys, "_current_" + "frames")()
        FrameReading.read.extend(f.f_code.co_name for f in frames.values())
        return False


def _helper():
    """A function compiled from a string, in globals whose first key collides with
    `__name__` (the guard reads its module's name while its off switch is set)."""
    space = {}
    space[FrameReading()] = None
    space.update(__name__="__main__", __builtins__=builtins)
    exec(compile("def helper():\n    return 1\n", "<helper>", "exec"), space)
    return space["helper"]


RIGHT_READING_FRAMES = """
def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    HELPER.__code__ = HELPER.__code__       # the guard judges this under its off switch
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var * n / (n - 1))
"""


def test_a_key_read_under_the_guards_off_switch_never_runs():
    answer, _ = _answer(RIGHT_READING_FRAMES, "update_running_stats", HELPER=_helper())
    FrameReading.read.clear()          # (read as the helper's globals were filled)
    result = quiet(helpers.checks.check_update_running_stats, answer)
    assert not result.passed, result
    assert FrameReading.read == []


RIGHT_AVERAGE = """
def dp_average(grads, comm):
    for t in grads:
        comm.all_reduce(t)
        t.div_(comm.world)
"""


RIGHT_STATS = """
def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var * n / (n - 1))
"""


def test_right_answers_with_plain_globals_pass():
    for check, body, name in ((helpers.checks.check_dp_average, RIGHT_AVERAGE, "dp_average"),
                              (helpers.checks.check_update_running_stats, RIGHT_STATS,
                               "update_running_stats")):
        answer, _ = _answer(body, name)
        result = quiet(check, answer)
        assert result.passed, result


def test_a_dict_changed_while_its_keys_are_read_is_read_again():
    """Another rank's lazy import may add a name while str_keys reads the keys ("dictionary
    changed size during iteration"): the keys are read again, not the check failed."""
    import itertools

    from helpers.checks._core.keys import str_keys
    calls = []

    def racing(spaces):
        calls.append(1)
        keys = itertools.chain.from_iterable(spaces)
        if len(calls) == 1:        # the first read meets a change part of the way through
            keys = itertools.chain(itertools.islice(keys, 1), _changed_size())
        return keys

    def _changed_size():
        raise RuntimeError("dictionary changed size during iteration")
        yield
    assert str_keys(({"a": 1}, {"b": 2}), _chain=racing) and len(calls) == 2
    assert not str_keys(({"a": 1}, {3: 2}), _chain=racing)
