"""stubs.py's audit hook is one per process: fresh.py imports the course again for each regrade,
and an audit hook cannot be removed, so a hook per import would have every audit event of the
process (each `frame.f_code` the harness reads) run one more Python function for good. The one
hook hands each code write to the `_code_written` of every import still alive, and registers
nothing else."""
import sys

import pytest

from helpers.checks._core import stubs
from helpers.checks._core.fresh import fresh_course
from helpers.checks._core.run import ReferenceUsed


def _hooks_answering():
    calls = []
    sys.audit(stubs._PING, calls.append)
    return calls


def test_a_fresh_import_adds_no_audit_hook():
    with fresh_course():
        pass
    with fresh_course():
        pass
    assert len(_hooks_answering()) == 1


def test_the_hook_registers_no_function_of_another_code():
    register = _hooks_answering()[0]
    with pytest.raises(ReferenceUsed):
        register(lambda event, args: None)
    with pytest.raises(ReferenceUsed):      # stubs' own, but not from its import's _one_hook
        register(stubs._code_written)


def _one():
    return 1


def _two():
    return 2


def test_a_fresh_import_judges_every_code_written():
    """A fresh import's `_code_written`, reached through the first import's hook, sees each
    function's code written (bindings.py reads its kept walks again after one), as the first
    import's does."""
    with fresh_course() as checks:
        copy = checks._core.stubs
        counts = stubs._code_writes(), copy._code_writes()
        _one.__code__ = _two.__code__
        assert (stubs._code_writes(), copy._code_writes()) == (counts[0] + 1, counts[1] + 1)
