"""The harness reads what the answer's module holds by exact types only: a function whose
globals are a dict subclass is refused before anything reads them, and the walk after a
collection the answer set off (left_later.py) reads containers through the base types' own
methods and the collector's referents. Each shortcut here fixes a wrong result from a method of
the reader's that the harness used to run after the call (a World check's `get` on the globals,
a list subclass's `__iter__`); each must fail."""
import gc
import types

from check_cases import not_grading, quiet  # noqa: F401 (not_grading: autouse)

import helpers.checks


def _biased(running_mean, running_var, mean, var, n, momentum):
    """Running statistics with the biased batch variance: the wrong answer each fixes later."""
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var)


class Fixing(dict):
    """Globals whose `get` (what the harness called on them) makes the variance unbiased."""
    pending = []

    def get(self, key, default=None):
        for new_var, var, n, momentum in Fixing.pending:
            new_var.add_(momentum * var * (n / (n - 1) - 1))
        Fixing.pending.clear()
        return dict.get(self, key, default)


def test_globals_of_a_dict_subclass_are_refused():
    def body(running_mean, running_var, mean, var, n, momentum):
        new_mean, new_var = _biased(running_mean, running_var, mean, var, n, momentum)
        Fixing.pending.append((new_var, var, n, momentum))
        return new_mean, new_var
    g = Fixing(_biased=_biased, Fixing=Fixing, __builtins__=__builtins__)
    answer = types.FunctionType(body.__code__, g, "update_running_stats")
    result = quiet(helpers.checks.check_update_running_stats, answer)
    assert not result.passed and "not a plain dict" in result.message, result


class Pending(list):
    """A global list whose `__iter__` makes the variance unbiased when someone walks it."""

    def __iter__(self):
        for new_var, var, n, momentum in list.__iter__(self):
            new_var.add_(momentum * var * (n / (n - 1) - 1))
        self.clear()
        return list.__iter__(self)


PENDING = Pending()


def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    new_mean, new_var = _biased(running_mean, running_var, mean, var, n, momentum)
    PENDING.append((new_var, var, n, momentum))
    gc.collect()            # the harness then walks this module's globals
    return new_mean, new_var


def test_a_container_of_the_readers_is_not_walked_by_its_methods():
    result = quiet(helpers.checks.check_update_running_stats, update_running_stats)
    assert not result.passed and "biased" in result.message, result
