"""The cases every check is tested on: the worked answer passes, shortcuts of at least
two different kinds fail with the message that names the skipped step, and at least one other
correct answer passes. A test module registers its answers with the decorators below and runs
them with `parametrize_cases(__name__)`; tests/test_checks_registry.py reads CASES and fails for
a check that lacks any of the three kinds.

    @worked("check_shard_sizes")
    def shard_sizes(n, k): ...

    @shortcut("check_shard_sizes", "measures a split", "with arithmetic")
    def shard_sizes_by_splitting(n, k): ...

    @other("check_shard_sizes")
    def shard_sizes_by_loop(n, k): ...

    test_case = parametrize_cases(__name__)
"""
import collections
import contextlib
import gc
import importlib
import io

import pytest

CASES = collections.defaultdict(lambda: {"worked": [], "shortcuts": [], "others": []})


class Case:
    def __init__(self, check, kind, fn, module, label=None, words=None):
        self.check, self.kind, self.fn, self.module = check, kind, fn, module
        self.label, self.words = label, words

    def __repr__(self):
        tail = f"[{self.label}]" if self.label else ""
        return f"{self.check}:{self.kind}:{self.fn.__name__}{tail}"

    def judge(self):
        import helpers.checks
        result = getattr(helpers.checks, self.check)(self.fn)
        if self.kind == "shortcut":
            assert result.status == "failed", f"{self}: the shortcut was not rejected: {result}"
            words = [self.words] if isinstance(self.words, str) else self.words
            for w in words:     # each must be named; a tuple: one of its words (two reasons)
                assert any(x in result.message for x in ((w,) if isinstance(w, str) else w)), \
                    f"{self}: {w!r} not in {result.message!r}"
        else:
            assert result.status == "passed", f"{self}: a right answer was rejected: {result}"


def _register(check, kind, label=None, words=None):
    def add(fn):
        case = Case(check, kind, fn, fn.__module__, label, words)
        CASES[check][{"worked": "worked", "shortcut": "shortcuts", "other": "others"}[kind]].append(
            case)
        return fn
    return add


def worked(check):
    """The notebook's worked answer (the solution cell's body)."""
    return _register(check, "worked")


def shortcut(check, kind, words):
    """An answer that skips the concept: `kind` names what it skips (two kinds at least per
    check), `words` (a string or a list) must be in the check's message."""
    return _register(check, "shortcut", kind, words)


def other(check, label=None):
    """Another correct answer, written differently (a different API form, number type, order)."""
    return _register(check, "other", label)


def cases_of(module):
    return [c for cases in CASES.values() for kind in cases.values() for c in kind
            if c.module == module]


def parametrize_cases(module):
    """A test function running every case registered in `module`."""
    @pytest.mark.parametrize("case", cases_of(module), ids=repr)
    def test_case(case, monkeypatch):
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
        monkeypatch.delenv("COURSE_GRADING", raising=False)
        case.judge()
    return test_case


def _stash():
    """Holds what escape_young keeps, on a function's attributes: where left_later.py's walk of an
    answer's module globals, closure and arguments does not look."""


_stash.kept = []


def escape_young(obj):
    """Keep `obj` (a weakref whose callback is an answer's) out of left_later.py's reach: held on
    a function's attribute and moved out of the young objects by a collection, so the tests of
    late.py's comparison at the check body's end still reach that comparison. A collection of
    the youngest generation is enough (its survivors move to the next), and costs far less than
    a full one."""
    _stash.kept.append(obj)
    gc.collect(0)


def exact_from_numbers(counts, ms, vs):
    """The ranks' statistics, already read out of torch as Python numbers, merged in exact
    Fractions and returned as float32 tensors."""
    from fractions import Fraction as Q

    import torch
    n = [Q(c) for c in counts]
    M = [[Q(v) for v in row] for row in ms]
    V = [[Q(v) for v in row] for row in vs]
    N = sum(n)
    mean = [sum(n[i] * M[i][j] for i in range(len(n))) / N for j in range(len(M[0]))]
    var = [sum(n[i] * (V[i][j] + (M[i][j] - mean[j]) ** 2) for i in range(len(n))) / N
           for j in range(len(M[0]))]
    return (torch.tensor([float(x) for x in mean], dtype=torch.float32),
            torch.tensor([float(x) for x in var], dtype=torch.float32))


def exact_mean_var(counts, means, variances):
    """The ranks' statistics merged in exact Fractions read out with .tolist(), returned as
    float32: the named wrong approach to global_mean_var, which the exit watch must see."""
    return exact_from_numbers(counts.tolist(), means.tolist(), variances.tolist())


@pytest.fixture(autouse=True)
def not_grading(monkeypatch):
    """A reader's run, not nbgrader's or a grading run's: every test of a module that imports
    it (`from check_cases import not_grading`)."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


def quiet(check, answer):
    """`check(answer)`'s Result, without its printed line."""
    with contextlib.redirect_stdout(io.StringIO()):
        return check(answer)


def ring_over(data, chunks):
    """A ring all-reduce of each device's tensor in `data`, in place, over the pieces `chunks[i]`
    cut from data[i] (how the pieces are cut is what the shortcut answers get wrong); the number
    of elements each device sent."""
    k, sent = len(data), [0] * len(data)
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(k - 1):
            for i in range(k):
                dst, c = (i + 1) % k, (i - s if phase == "reduce-scatter" else i + 1 - s) % k
                if phase == "reduce-scatter":
                    chunks[dst][c].add_(chunks[i][c].to(data[dst].device))
                else:
                    chunks[dst][c].copy_(chunks[i][c])
                sent[i] += chunks[i][c].numel()
    return sent


def spread_over(chunks):
    """All-reduce by spreading, in place: device i sums piece i of every device's pieces
    `chunks`, then sends it back to each."""
    k = len(chunks)
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[i][i].add_(chunks[j][i].to(chunks[i][i].device))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


def raw_copy(dst, src, nbytes):
    """ctypes' memmove, reached by names built at run time: the way past every watch that the
    scan cannot refuse by name (book/teachers.md), for shortcuts that test the checks behind
    it (an answer that names ctypes is refused before they run)."""
    lib = importlib.import_module("ct" + "ypes")
    getattr(lib, "mem" + "move")(dst, src, nbytes)

def dp_peers(comm):
    """The world ranks of a dp_average rank's data-parallel group: check_dp_average runs on a
    dp x tp mesh (row-major), `comm` one column, torch.distributed's default group the mesh."""
    import torch.distributed as dist
    tp = dist.get_world_size() // comm.world
    return list(range(dist.get_rank() % tp, dist.get_world_size(), tp))


def dp_group(comm):
    """dp_average's data-parallel group for torch.distributed's calls (`group=`): every rank
    creates every column's group, in one order (torch's new_group is a call of every rank of
    the default group), and keeps its own."""
    import torch.distributed as dist
    world, tp = dist.get_world_size(), dist.get_world_size() // comm.world
    groups = [dist.new_group(list(range(j, world, tp))) for j in range(tp)]
    return groups[dist.get_rank() % tp]


_POSTED = {}     # what each rank posts for posted_then: a module global, outside the comm


def posted_then(grads, comm, out, into):
    """A dp_average shortcut's frame: each gradient's `out(g)` kept in a global (keyed by world
    rank), a zeros all-reduce of its size (the bytes a right answer sends), then the mean of
    the copies of every rank of its group made by `into(kept, g)`."""
    import torch
    import torch.distributed as dist
    _POSTED[dist.get_rank()] = [out(g.detach()) for g in grads]
    for i, g in enumerate(grads):
        decoy = torch.zeros_like(g)
        comm.all_reduce(decoy)              # every rank has posted when this returns
        g.copy_(decoy + sum(into(_POSTED[q][i], g) for q in dp_peers(comm)) / comm.world)



def raw_floats(ptr, n):
    """n float32 values read at address `ptr` by numpy's raw-pointer protocol, its name built at
    run time (the scan refuses reader code that names it): memory made from a data_ptr(), for
    shortcuts that test the checks behind the scan."""
    import numpy as np
    holder = type("Raw", (), {"__array" + "_interface__": {
        "data": (ptr, True), "shape": (n,), "typestr": "<f4", "version": 3}})()
    return np.asarray(holder).copy()


def storage_at(ptr, device, nbytes):
    """torch's storage over the memory at address `ptr`, its maker reached by a name built at
    run time (the scan refuses reader code that names it)."""
    import torch
    return getattr(torch._C, "_construct_storage" + "_from_data_pointer")(ptr, device, nbytes)
