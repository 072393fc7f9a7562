"""The runtime's ThreadWorld frees what a collective carried once every rank of its group took
its result (a long threads-mode run holds no payload of earlier calls)."""
import gc
import types

import torch

from helpers.runtime.thread_world import ThreadWorld

_MB = 2 ** 18              # float32 elements in 1 MB


def _held_bytes(world):
    """Bytes of the tensors the world reaches (its dicts, lists and objects, not modules)."""
    seen, todo, total = set(), [world], 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            total += o.numel() * o.element_size()
        else:
            todo.extend(gc.get_referents(o))
    return total


def test_collectives_leave_no_payload_behind():
    w = ThreadWorld(2, timeout=10.0, record=False)
    held = []

    def fn(comm):
        t = torch.ones(_MB)
        for _ in range(100):
            comm.all_reduce(t)
            held.append(len(w._slots) + len(w._done))
        return t[0].item()

    assert w.run(fn) == [2.0 ** 100] * 2
    assert not w._slots and not w._done and not w._taken
    assert max(held) <= 4                     # one call in flight per rank, at most
    assert _held_bytes(w) < _MB               # neither the ranks' copies nor the results remain


def test_a_recording_world_frees_the_slots_too():
    w = ThreadWorld(3, timeout=10.0)
    w.run(lambda comm: [comm.all_gather(torch.ones(4)) for _ in range(5)])
    assert not w._slots and not w._done and len(w.sent("all_gather")) == 15
