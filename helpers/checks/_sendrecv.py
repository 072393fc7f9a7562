"""What Part VII's checks share: answers that communicate run on the harness's World of thread
ranks, whose network records every message, so a check judges what an answer sent and to whom,
not only the numbers it returned."""
import collections

import torch

from ._core import CheckFailed, World, as_int, expect

__all__ = ["TIMEOUT"]

TIMEOUT = 5.0


def _threads(fn, world, *args, reword=None):
    """fn(comm, *args) on `world` thread ranks: (results, the sends each rank made, the World,
    whose `expect_from_messages` judges whether a result was made of what its rank received).
    reword(world, error) -> the words for a check's own cause of a failure (None: the error's)."""
    w = World(world, timeout=TIMEOUT, record_ops=True)
    try:
        with torch.random.fork_rng():
            results = w.run(fn, *args)
    except TimeoutError as e:
        raise CheckFailed(f"on {world} ranks: {e}") from None
    except CheckFailed as e:
        words = reword and reword(w, e)
        if words:
            raise CheckFailed(words) from None
        raise
    other = sorted({m.op for m in w.messages if m.op not in ("send", "recv")})
    expect(not other, f"on {world} ranks your code called {', '.join(other)}: this exercise "
                      "exchanges its data with send and recv only (a collective that gathers "
                      "everything is not the point-to-point pattern asked for)")
    sends = [[m for m in w.messages if m.op == "send" and m.src == r] for r in range(world)]
    return results, sends, w


def _carries(messages, blocks):
    """True when the values of `blocks` are among the values the messages carried (a multiset
    test: any packing of the payload passes, zeros of the right size do not)."""
    sent = collections.Counter(v for m in messages if m.tensor is not None
                               for v in m.tensor.detach().double().flatten().tolist())
    want = collections.Counter(v for b in blocks for v in b.double().flatten().tolist())
    return not (want - sent)


def _as_list(value, what):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {value!r}, expected a list of positions") from None


def _pair(got, what):
    try:
        a, b = got
        return as_int(a, what), as_int(b, what)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {got!r}, expected a pair (first row, "
                          "columns)") from None
