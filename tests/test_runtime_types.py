"""The comm protocol (helpers.runtime.comm.Comm) is what DistComm and ThreadComm both give:
code written against it runs on process ranks and thread ranks alike."""
import inspect

from helpers.runtime.comm import Comm, DistComm, ThreadComm
from helpers.runtime.thread_world import ThreadWorld


def _methods(cls):
    return {n: inspect.signature(f) for n, f in vars(cls).items()
            if callable(f) and not n.startswith("_")}


def test_both_comms_give_every_call_of_the_protocol_with_its_parameters():
    want = _methods(Comm)
    assert {"send", "recv", "all_reduce", "all_gather", "reduce_scatter", "wait"} <= set(want)
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
