"""The checks' world of thread ranks is the runtime's (one ThreadWorld, one ThreadComm; a run
that fails is the runtime's RankFailed or a TimeoutError), and its ranks cannot pass tensors to
each other but through the comm: answers that share data through a module global or a closure
list fail, naming it (tests/check_cases.py)."""
import ast
import inspect
import threading

import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut
from thread_ranks import run_threads

import helpers
import helpers.checks
import helpers.checks._core
from helpers.checks._core import CheckFailed, World
from helpers.runtime import errors
from helpers.runtime.comm import ThreadComm
from helpers.runtime.errors import LaunchTimeout
from helpers.runtime.thread_world import ThreadWorld

NAMES = "never travelled through the comm"
_shared = []      # a module global every thread rank reaches


def test_one_thread_world():
    world = World(2)
    assert isinstance(world, ThreadWorld)
    assert type(world.comm(0)) is ThreadComm and world.comm(0) is world.comm(0)
    assert helpers.RankFailed is errors.RankFailed and LaunchTimeout is errors.LaunchTimeout
    assert not hasattr(helpers.checks._core, "RankFailed")


def test_the_world_uses_only_the_thread_worlds_declared_hooks():
    """The grader's World overrides, calls and reads no private member of ThreadWorld: the
    runtime's subclass contract (ThreadWorld's docstring, tests/test_thread_world.py) is all
    it builds on, so a refactoring of thread_world.py that keeps the hooks keeps the checks."""
    base = ThreadWorld(1)
    private = {n for n in set(dir(base)) | set(vars(base))
               if n.startswith("_") and not n.startswith("__")}
    tree = ast.parse(inspect.getsource(helpers.checks._core.world))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert private and not used & private, sorted(used & private)


# ---- the shortcuts: data passed past the comm --------------------------------------------------
@shortcut("check_dp_average", "passes the gradients through a module global", NAMES)
def dp_average_through_a_global(grads, comm):
    _shared.append(grads)
    comm.all_reduce(torch.zeros(1))            # a decoy: every rank has appended its list
    group = _shared[-comm.world:]
    avg = [sum(s[i] for s in group) / comm.world for i in range(len(grads))]
    comm.all_reduce(torch.zeros(1))            # every rank has read before any writes
    for g, a in zip(grads, avg):
        g.copy_(a)


@shortcut("check_dp_average", "reads the other ranks' gradients with tolist", NAMES)
def dp_average_through_tolist(grads, comm):
    _shared.append(grads)
    comm.all_reduce(torch.zeros(1))
    group = _shared[-comm.world:]
    avg = [torch.tensor([s[i].tolist() for s in group]).mean(0) for i in range(len(grads))]
    comm.all_reduce(torch.zeros(1))
    for g, a in zip(grads, avg):
        g.copy_(a)


def _closure_cheat():
    box = []

    def dp_average(grads, comm):                  # rank 0 writes the average into every list
        box.append(grads)
        dist.barrier()
        if comm.rank == 0:
            for i in range(len(grads)):
                avg = sum(b[i] for b in box[-comm.world:]) / comm.world
                for b in box[-comm.world:]:
                    b[i].copy_(avg)
        comm.all_reduce(torch.zeros(1))
    return dp_average


shortcut("check_dp_average", "writes into the other ranks' tensors from a closure",
         NAMES)(_closure_cheat())


@other("check_dp_average", "each rank reads its own tensors as Python numbers")
def dp_average_own_numbers(grads, comm):
    for g in grads:
        mine = torch.tensor(g.tolist())
        comm.all_reduce(mine)
        g.copy_(mine / comm.world)


test_case = parametrize_cases(__name__)


# ---- a buffer every rank reaches, written by each rank's collective ----------------------------
_BUFFERS = {}     # output buffers by size, a module global: one per process on gloo, shared here


def grad_shard_cached_buffer(flat_grad):
    world = dist.get_world_size()
    padded = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    n = padded.numel() // world
    out = _BUFFERS.setdefault((n, padded.dtype), padded.new_empty(n))
    dist.reduce_scatter_tensor(out, padded)
    return out / world


def test_a_buffer_shared_by_the_ranks_collectives_is_refused_on_every_run():
    """Whichever rank's delivery comes second, and whatever the others did with the buffer in
    between, the verdict names the shared object: not "wrong values", never a pass."""
    for _ in range(6):
        result = helpers.checks.check_grad_shard(grad_shard_cached_buffer)
        assert result.status == "failed" and "module global" in result.message, result


# ---- the functional collectives: not played, and the answer told which calls are --------------
def test_functional_collectives_are_named_with_the_calls_the_world_plays():
    import torch.distributed._functional_collectives as funcol

    def dp_average_funcol(grads, comm):
        for g in grads:
            g.copy_(funcol.all_reduce(g, "sum", list(range(comm.world))) / comm.world)
    result = helpers.checks.check_dp_average(dp_average_funcol)
    assert result.status == "failed", result
    for words in ("_functional_collectives", "dist.all_reduce", "torch.distributed.nn"):
        assert words in result.message, result.message


# ---- the world itself --------------------------------------------------------------------------
def test_a_rank_may_read_what_the_check_handed_to_every_rank_and_what_it_received():
    X = torch.arange(6.0)

    def fn(comm):
        mine = X[comm.rank * 3:(comm.rank + 1) * 3].clone()
        comm.send(mine, 1 - comm.rank)
        got = comm.recv(1 - comm.rank, (3,))
        comm.wait()
        return (got + mine).tolist(), comm.all_gather(mine).sum().item()
    res = World(2).run(fn)
    assert res[0] == res[1] == ([3.0, 5.0, 7.0], 15.0)


def test_another_ranks_tensor_is_refused_even_in_a_second_run():
    world, box = World(2), []
    world.run(lambda comm: torch.ones(1))

    def fn(comm):
        box.append(torch.full((1,), float(comm.rank)))
        dist.barrier()
        return sum(box).item()
    with pytest.raises(CheckFailed, match=NAMES):
        world.run(fn)


def test_tolist_is_restored_after_a_run():
    before = torch.Tensor.tolist
    World(2).run(lambda comm: torch.ones(1).tolist())
    assert torch.Tensor.tolist is before and torch.ones(2).tolist() == [1.0, 1.0]


def test_a_hang_is_a_timeout_naming_what_the_rank_waited_for():
    with pytest.raises(TimeoutError, match="from rank 0 .* never sent"):
        World(2, timeout=0.3).run(lambda comm: comm.recv(0, (1,)) if comm.rank else None)
    stop = threading.Event()
    world = World(2, timeout=0.1)
    world.deadline = 0.5
    with pytest.raises(errors.LaunchTimeout, match=r"rank 1 still running"):
        world.run(lambda comm: stop.wait(5) if comm.rank else None)
    stop.set()


def test_launch_and_run_threads_keep_no_copy_of_what_travelled():
    """A long threads-mode run would otherwise hold every tensor it ever sent."""
    _, comms = run_threads(lambda comm: comm.all_reduce(torch.ones(1000)), 2)
    assert comms[0].traffic.payload_bytes("all_reduce") == 4000
    quiet = ThreadWorld(2, 5.0, record=False)       # as run_threads and launch make theirs
    quiet.run(lambda comm: comm.all_reduce(torch.ones(1000)))
    assert quiet.messages == [] and quiet.timeline == [[], []]
    world = World(2)
    world.run(lambda comm: comm.all_reduce(torch.ones(1000)))
    assert [m.nbytes for m in world.sent("all_reduce")] == [4000, 4000]


def test_a_rank_waits_longer_on_a_busy_machine(monkeypatch):
    """A right answer's rank must not time out because the machine is loaded (it waits for a
    CPU, not for a message): the wait scales with the load per core, at most tenfold."""
    from helpers.checks._core import world as world_module
    monkeypatch.setattr(world_module.os, "cpu_count", lambda: 2)
    for load, factor in ((0.5, 1.0), (2.0, 1.0), (8.0, 4.0), (100.0, 10.0)):
        monkeypatch.setattr(world_module.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert World(2, timeout=0.5).timeout == 0.5 * factor
    monkeypatch.setattr(world_module.os, "getloadavg", lambda: (_ for _ in ()).throw(OSError))
    assert World(2, timeout=0.5).timeout == 0.5
