"""The comm protocol (helpers.runtime.comm.Comm) is what DistComm and ThreadComm both give:
code written against it runs on process ranks and thread ranks alike."""
import inspect

import pytest
import torch
import torch._dynamo  # here, not lazily in a rank thread (slow: past its deadline)

from helpers.runtime.comm import Comm, DistComm, ThreadComm
from helpers.runtime.thread_world import ThreadWorld


def _methods(cls):
    return {n: inspect.signature(f) for n, f in vars(cls).items()
            if callable(f) and not n.startswith("_")}


def test_both_comms_give_every_call_of_the_protocol_with_its_parameters():
    want = _methods(Comm)
    assert {"send", "recv", "all_reduce", "all_gather", "reduce_scatter", "isendrecv",
            "wait"} <= set(want)
    for cls in (DistComm, ThreadComm):
        for name, sig in want.items():
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
            got = inspect.signature(getattr(cls, name))
            params = [(p.name, p.default) for p in sig.parameters.values()]
            assert [(p.name, p.default) for p in got.parameters.values()][:len(params)] \
                == params, f"{cls.__name__}.{name}{got} is not Comm.{name}{sig}"


def test_a_thread_comm_has_the_protocols_attributes():
    comm = ThreadWorld(2).comm(1)
    assert (comm.rank, comm.world, comm.device.type) == (1, 2, "cpu")
    assert set(Comm.__annotations__) == {"rank", "world", "device"}


def _ring_exchange(comm):
    """Two tensors to the next rank and two from the previous one, posted together."""
    nxt, prv = (comm.rank + 1) % comm.world, (comm.rank - 1) % comm.world
    a = torch.full((3,), float(comm.rank))
    b = torch.full((2, 2), float(comm.rank), dtype=torch.float64)
    hop = comm.isendrecv([(a, nxt, 5), (b, nxt, 6)],
                         [(prv, (3,), torch.float32, 5), (prv, (2, 2), torch.float64, 6)])
    return comm.traffic.records, hop.wait()


def test_both_comms_record_the_same_traffic_for_the_same_exchange():
    """isendrecv on a DistComm (torch.distributed, played here by the checks' World) and on a
    ThreadComm: the same Transfer records, the same tensors received, the same messages on the
    network."""
    from helpers.checks._core import World
    from helpers.runtime.traffic import Transfer
    runs = {}
    for name, make in (("thread", lambda comm: comm), ("dist", lambda comm: DistComm())):
        world = World(3, timeout=10.0)
        runs[name] = world.run(lambda comm, make=make: _ring_exchange(make(comm))), \
            [world.traffic(r).records for r in range(3)]
    (thread, thread_net), (dist, dist_net) = runs["thread"], runs["dist"]
    for r in range(3):
        nxt, prv = (r + 1) % 3, (r - 1) % 3
        want = [Transfer("send", r, nxt, 12, 12, None, 4),
                Transfer("send", r, nxt, 32, 32, None, 8)]
        assert thread[r][0] == dist[r][0] == thread_net[r] == dist_net[r] == want
        for got in (thread[r][1], dist[r][1]):
            assert [g.dtype for g in got] == [torch.float32, torch.float64]
            assert all(torch.equal(g, torch.full_like(g, prv)) for g in got)


def _pipeline_pair(comm):
    """Rank 0 sends and receives in one sendrecv, rank 1 receives then sends back: what the
    pipeline's exchange does. Rank 0's send is still outstanding after its sendrecv."""
    x = torch.arange(4.0)
    if comm.rank == 0:
        back = comm.sendrecv((x, 1), (1, (4,)))
        held = len(comm._pending)
    else:
        got = comm.sendrecv(recv=(0, (4,), torch.float32))
        back, held = comm.sendrecv((got * 2, 0)), len(comm._pending)
    comm.wait()
    return comm.traffic.records, back, held, len(comm._pending)


def test_both_comms_sendrecv_through_isendrecv_alike():
    """sendrecv on a DistComm and on a ThreadComm: the same records, the same tensor back, the
    send held until wait() on both."""
    from helpers.checks._core import World
    from helpers.runtime.traffic import Transfer
    runs = {}
    for name, make in (("thread", lambda comm: comm), ("dist", lambda comm: DistComm())):
        runs[name] = World(2, timeout=10.0).run(
            lambda comm, make=make: _pipeline_pair(make(comm)))
    for r in range(2):
        want = [Transfer("send", r, 1 - r, 16, 16, None, 4)]
        assert runs["thread"][r][0] == runs["dist"][r][0] == want
        assert runs["thread"][r][2:] == runs["dist"][r][2:] == (1, 0)
    for name in runs:
        assert torch.equal(runs[name][0][1], torch.arange(4.0) * 2)
        assert runs[name][1][1] is None


def test_dist_comm_sendrecv_on_gloo_ranks():
    """On real gloo ranks: each receive waited for once (a second wait on gloo's receive waits
    for another message, and hangs), the sends finished by wait()."""
    import launch_targets as lt

    import helpers
    got = helpers.launch(lt.sendrecv_pairs, 2, quiet=True, timeout=240)
    assert got == [([2.0, 4.0, 6.0], 3.0, 4, 0), ([1.0, 2.0, 3.0], None, 4, 0)]


def test_both_comms_refuse_an_op_they_do_not_reduce_with_naming_theirs():
    """A ThreadComm summed on an unknown op, a DistComm raised a bare KeyError: both refuse it
    before counting anything."""
    words = r"all_reduce\(op='avg'\): the comms reduce with 'sum' or 'max'"
    with pytest.raises(ValueError, match=words):
        DistComm.__new__(DistComm).all_reduce(torch.ones(2), op="avg")
    w = ThreadWorld(1)
    comm = w.comm(0)
    with pytest.raises(ValueError, match=words):
        w.run(lambda comm: comm.all_reduce(torch.ones(2), op="avg"))
    assert comm.traffic.calls() == 0
    assert w.run(lambda comm: comm.all_reduce(torch.ones(2), op="max").tolist()) == [[1.0, 1.0]]
