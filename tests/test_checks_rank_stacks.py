"""early_threads.hidden_worker refuses an answer while a thread started before it runs the
reader's code, judged by a snapshot of each thread's stack (`_current_frames`). A World's own
rank is the check's whatever that snapshot shows: between its steps (its rank context closed,
a collection's finalizer, a chain cut at a suspended generator) no check frame lies below a
library's code compiled from a string, such as a namedtuple's `__new__` (`<lambda>` in
`<string>`), and the check refused its own rank (seen in CI for check_overlap_hooks). And a
namedtuple's generated `__new__` on any thread is no one's code; a copy of its template that
calls a function of the reader's is the reader's."""
import threading

import pytest
import torch.distributed as dist

from helpers.checks._core import early_threads
from helpers.checks._core.world import World
from helpers.runtime.traffic import Transfer


def _tuple_of(cls, *args):
    return tuple.__new__(cls, args)


FORGED = eval("lambda _cls, a, b: _tuple_new(_cls, (a, b))", {"_tuple_new": _tuple_of})


def _frame(made):
    """The frame of a namedtuple `__new__` (the course's Transfer: "library") or of a copy of
    its template calling a function of the reader's ("reader"), run as a Thread's target: the
    frames below it are threading's alone, as on a rank between its steps."""
    call, args, code = ((Transfer, range(len(Transfer._fields)), Transfer.__new__.__code__)
                        if made == "library" else (FORGED, (tuple, 1, 2), FORGED.__code__))
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            seen.append(frame)
    threading.setprofile(profile)
    try:
        thread = threading.Thread(target=call, args=tuple(args))
        thread.start()
        thread.join()
    finally:
        threading.setprofile(None)
    assert seen[0].f_code.co_filename == "<string>"
    return seen[0]


@pytest.mark.parametrize("made", ["library", "reader"])
def test_a_world_rank_between_its_steps_is_the_checks_own(monkeypatch, made):
    """Rank 0 (as its answer starts) scans while rank 1's snapshot shows only code compiled
    from a string over threading's frames: rank 1 is the World's own, observed by its modes."""
    frame, idents, seen = _frame(made), {}, []
    w = World(2)

    def body(comm):
        idents[comm.rank] = threading.get_ident()
        dist.barrier()                      # both ranks run (rank 1 waits at the next one)
        if comm.rank == 0:
            monkeypatch.setattr(early_threads, "_current_frames", lambda: {idents[1]: frame})
            seen.append(early_threads.hidden_worker())
        dist.barrier()
    w.run(body)
    assert seen == [None], f"the World's own rank was taken for a hidden worker: {seen}"


@pytest.mark.parametrize("made", ["library", "reader"])
def test_a_namedtuples_generated_new_is_no_ones(monkeypatch, made):
    """The main thread (started before any check, not a rank) seen in a namedtuple's `__new__`
    runs no one's code; in the reader's copy of the template, the reader's."""
    frame, got = _frame(made), []
    main = threading.main_thread()
    monkeypatch.setattr(early_threads, "_current_frames", lambda: {main.ident: frame})
    scan = threading.Thread(target=lambda: got.append(early_threads.hidden_worker()))
    scan.start()
    scan.join()
    if made == "library":
        assert got == [None], f"a namedtuple's __new__ was taken for the reader's code: {got}"
    else:
        assert got[0] is not None and "<lambda> in <string>" in got[0], got
