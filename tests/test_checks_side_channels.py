"""Data cannot travel between thread ranks past the byte count, through two side channels:

1. a message's metadata: the shape of a zero-element message (no payload bytes), read back from
   the error of a recv into a buffer of another shape, from a collective's error, or from the
   shape or strides of what arrives (world.py: a recv takes exactly what was sent, a
   collective's ranks hand one shape and dtype, an error there fails the answer even if caught,
   in words that name nothing another rank sent; runtime/comm.py's `wire`: strides stay home);
2. numbers made plain by int and float methods (`.real`, `.numerator`, `hash()`, an unbound
   `int.__add__`), or bits cut into pieces too small to fingerprint (rank_numbers.py: every
   method dir() lists keeps the tag; integers not round and the floats under an integer view
   are fingerprinted; provenance.py: integers viewed as floats are checked like Python data).
"""
import re

import pytest
import torch
import torch.distributed as dist
from check_cases import dp_peers, parametrize_cases, shortcut

from helpers.checks._core import CheckFailed
from helpers.checks._core.rank_numbers import UNTAGGED, Tagged, TaggedInt, ranks_of
from helpers.checks._core.world import World
from helpers.runtime.thread_world import ThreadWorld

SENT = "what its sender sends"
CALLS = "did not match the other ranks' calls"
READ = "read out of its own tensors"


# ---- 1. a message's metadata --------------------------------------------------------------------
def _halves(shard):
    out = []
    for b in shard.contiguous().view(torch.int32).tolist():
        out += [(b + 2**31) >> 16, (b + 2**31) & 0xFFFF]
    return out


def _floats(halves):
    ints = [(a << 16) + b for a, b in zip(halves[0::2], halves[1::2])]
    return (torch.tensor(ints, dtype=torch.int64) - 2**31).to(torch.int32).view(torch.float32)


def _qwz_through(shard, move):
    """Every other rank's shard moved by `move(halves, rank)` (metadata, no payload); one
    4-byte all-gather as the message the result's dataflow reaches."""
    w, r = dist.get_world_size(), dist.get_rank()
    got = move(_halves(shard), r, w)
    one = torch.empty(w)
    dist.all_gather_into_tensor(one, shard[:1].abs() + 1)
    return torch.cat([shard.clone() if s == r else _floats(got[s]) * (one[s] / one[s])
                      for s in range(w)])


def _by_recv_errors(halves, r, w):
    got = {}
    for d in range(w):
        if d != r:
            for i in range(0, len(halves), 3):
                dist.send(torch.empty(0, *halves[i:i + 3]), dst=d, tag=1000 + i // 3)
    for s in range(w):
        got[s] = []
        for i in range(0, len(halves), 3):
            try:
                dist.recv(torch.empty(0), src=s, tag=1000 + i // 3)
            except Exception as e:   # the shortcut reads the error
                dims = re.search(r"got \(([^)]*)\)", str(e))
                got[s] += [int(x) for x in dims.group(1).split(",") if x.strip()][1:] if dims \
                    else []
    return got


def _by_reduce_errors(halves, r, w):
    got = {s: [] for s in range(w)}
    for s in range(w):
        for h in halves if s == r else range(len(halves)):
            try:      # torch's error named every rank's shape
                dist.all_gather([torch.empty(0) for _ in range(w)],
                                torch.empty(0, h) if s == r else torch.empty(0))
            except Exception as e:   # the shortcut reads torch's words
                dims = re.search(r"\[0, (\d+)\]", str(e))
                got[s].append(int(dims.group(1)) if dims else 0)
                if not dims and len(got[s]) > 3:   # refused, words that name nothing: stop
                    return got
    return got


@shortcut("check_qwz_all_gather", "float shards in the shapes of zero-element sends, read from "
          "the recv's error (refused first by the allow-list; the recv route: the tests below)",
          "allows only all_gather")
def qwz_shapes_through_recv_errors(shard, block):
    return _qwz_through(shard, _by_recv_errors)


@shortcut("check_qwz_all_gather", "float shards in the shapes of zero-element all-gathers, read "
          "from the collective's error", CALLS)
def qwz_shapes_through_reduce_errors(shard, block):
    return _qwz_through(shard, _by_reduce_errors)


def _run(fn, world=None):
    world = world or World(2, timeout=30.0)
    return world, world.run(fn)


def test_a_caught_recv_mismatch_still_fails_and_names_no_sent_shape():
    seen = []

    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.empty(0, 4321, 8765), 1)
            return None
        try:
            comm.recv(0, (0,))
        except CheckFailed as e:
            seen.append(e)
        return "caught"
    with pytest.raises(CheckFailed, match=SENT) as failed:
        _run(fn)
    for e in (failed.value, *seen):
        assert "4321" not in str(e) and "8765" not in str(e)
        assert e.__context__ is None and e.__cause__ is None


def test_a_recv_of_another_dtype_fails():
    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(3, dtype=torch.float64), 1)
        else:
            comm.recv(0, (3,), dtype=torch.float32)
    with pytest.raises(CheckFailed, match=SENT):
        _run(fn)


def test_a_caught_collective_mismatch_still_fails_and_names_no_other_shape():
    def fn(comm):
        try:       # cat along dim 1 would have told the sum of the others' widths
            return tuple(comm.all_gather(torch.empty(0, 1000 + 17 * comm.rank), dim=1).shape)
        except CheckFailed as e:
            assert "1017" not in str(e) and "1000" not in str(e)
            return None
    with pytest.raises(CheckFailed, match=CALLS):
        _run(fn)


def test_strides_stay_home():
    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.empty_strided((1, 1), (999, 777)).zero_(), 1)
            comm.all_gather(torch.empty_strided((1, 1), (555, 333)).zero_(), dim=1)
            comm.wait()
            return None
        got = comm.recv(0, (1, 1))
        return got.stride(), comm.all_gather(torch.zeros(1, 1), dim=1).stride()
    _, results = _run(fn)
    assert results[1] == ((1, 1), (2, 1))


def test_the_runtime_names_both_shapes_and_keeps_the_message():
    """launch(threads=True)'s world: a reader's mismatched recv says what arrived, and the
    message stays for a recv of the right shape."""
    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.arange(6.0).view(2, 3), 1)
            return None
        with pytest.raises(ValueError, match=r"expected shape \(3, 2\).*got \(2, 3\)"):
            comm.recv(0, (3, 2))
        return comm.recv(0, (2, 3)).tolist()
    assert ThreadWorld(2, timeout=30.0).run(fn)[1] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


# ---- 2. numbers made plain ------------------------------------------------------------------
_BOARD = {}


def _qwz_board(shard, how, view=torch.int32):
    w, r = dist.get_world_size(), dist.get_rank()
    _BOARD[(id(_BOARD), r)] = [how(b) for b in shard.contiguous().view(view).tolist()]
    one = torch.empty(w)
    dist.all_gather_into_tensor(one, shard[:1].abs() + 1)      # 4 bytes: also the barrier
    return torch.cat([shard.clone() if s == r else
                      torch.tensor(_BOARD[(id(_BOARD), s)], dtype=view).view(torch.float32)
                      * (one[s] / one[s]) for s in range(w)])


@shortcut("check_qwz_all_gather", "float bits on a board, made plain by .real", READ)
def qwz_board_real(shard, block):
    return _qwz_board(shard, lambda b: b.real)


@shortcut("check_qwz_all_gather", "float bits on a board, made plain by hash()", READ)
def qwz_board_hash(shard, block):
    return _qwz_board(shard, hash)


@shortcut("check_qwz_all_gather", "float bits on a board, made plain by an unbound int.__add__",
          READ)
def qwz_board_unbound_add(shard, block):
    return _qwz_board(shard, lambda b: int.__add__(b, 0))


@shortcut("check_qwz_all_gather", "float bytes on a board (uint8: too small to fingerprint), "
          "made plain by (0).__add__", READ)
def qwz_board_bytes(shard, block):
    return _qwz_board(shard, lambda b: (0).__add__(b), view=torch.uint8)


@shortcut("check_dp_average", "gradient bits on a board, made plain by .numerator", READ)
def dp_average_board_numerator(grads, comm):
    k, r = comm.world, dist.get_rank()
    for i, g in enumerate(grads):
        _BOARD[(id(_BOARD), "dp", r, i)] = [
            b.numerator for b in g.detach().reshape(-1).view(torch.int32).tolist()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat)                                       # only a barrier
    for i, g in enumerate(grads):
        others = [torch.tensor(_BOARD[(id(_BOARD), "dp", s, i)], dtype=torch.int32)
                  .view(torch.float32).view(g.shape) for s in dp_peers(comm) if s != r]
        g.copy_((g + sum(others)) / k * (flat[:1] / flat[:1]))


_ARGS = [(), (3,), (2.5,), (1, 2)]


@pytest.mark.parametrize("value", [Tagged(2.75, {1}), TaggedInt(70001, {1})],
                         ids=["Tagged", "TaggedInt"])
def test_every_method_that_returns_a_number_keeps_the_tag(value):
    """dir() walked: a method a new Python adds is held to it too."""
    base = type(value).__mro__[1]
    checked = []
    for name in sorted(set(dir(base)) - UNTAGGED):
        attr = getattr(value, name)
        if isinstance(getattr(base, name), type) or name.startswith("__") and name in (
                "__class__", "__doc__", "__new__", "__init__", "__init_subclass__",
                "__subclasshook__", "__getattribute__", "__setattr__", "__delattr__",
                "__reduce__", "__reduce_ex__", "__dir__", "__getstate__", "__getformat__"):
            continue
        if getattr(attr, "__self__", value) is base:        # classmethods: fromhex, from_bytes
            continue
        if callable(attr):
            out = next((o for o in (_call(attr, a) for a in _ARGS) if o is not _FAILED), _FAILED)
        else:
            out = attr
        if out is _FAILED or out is NotImplemented:
            continue
        leaves = out if isinstance(out, tuple) else (out,)
        for leaf in leaves:
            if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
                assert 1 in ranks_of(leaf), f"{type(value).__name__}.{name} dropped the tag"
                checked.append(name)
    assert {"real", "conjugate", "as_integer_ratio", "__round__", "__trunc__"} <= set(checked)
    if isinstance(value, int):
        assert {"numerator", "denominator", "__index__", "bit_length", "__getnewargs__"} <= set(
            checked)


_FAILED = object()


def _call(fn, args):
    try:
        return fn(*args)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return _FAILED


test_case = parametrize_cases(__name__)
