"""Rank functions for tests/test_launch.py: a spawned rank imports its function by name, so
they live in a module (not in the test file, whose module name depends on how pytest runs)."""
import os
import signal
import time

import torch
import torch.distributed as dist


def report(rank, world, cfg):
    """What a rank sees: its environment, threads and device, and an all-reduce's result."""
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return dict(rank=rank, world=world, sum=float(t), threads=torch.get_num_threads(),
                master_addr=os.environ["MASTER_ADDR"], device=str(cfg["device"]),
                backend=dist.get_backend(), pid=os.getpid(), tensor=torch.arange(3) * rank)


def raise_on_rank_1(rank, world, cfg):
    if rank == 1:
        raise ValueError("the answer is not 42")
    dist.barrier()          # rank 0 waits for rank 1, which never comes
    return rank


def die_on_rank_1(rank, world, cfg):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return rank


def hang_on_rank_1(rank, world, cfg):
    if rank == 1:
        time.sleep(3600)
    return rank


def sleep_and_write_pid(rank, world, cfg):
    """Write this rank's pid, then sleep: the test kills the launching process meanwhile."""
    with open(os.path.join(cfg["folder"], f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def thread_sum(rank, world, cfg):
    """A threads-mode rank: an all-reduce through the ThreadComm in cfg["comm"]."""
    t = torch.tensor([float(rank + 1)])
    cfg["comm"].all_reduce(t)
    return float(t)


def how_started(rank, world, cfg):
    """Who started this rank, what it had imported before its function ran, and a variable of
    the caller's environment set after the fork server started."""
    import sys
    return dict(ppid=os.getppid(), probe=os.environ.get("COURSE_LAUNCH_PROBE"),
                threads=torch.get_num_threads(), had_helpers="helpers" in sys.modules,
                had_torchvision="torchvision" in sys.modules)


def mismatch_on_rank_1(rank, world, cfg):
    """The ranks disagree on a collective's size: gloo aborts a process (SIGABRT) after
    printing why on its stderr."""
    t = torch.zeros(2 if rank == 0 else 3)
    dist.all_gather([torch.empty_like(t) for _ in range(world)], t)
    return rank


def mesh_groups_both_ways(rank, world, cfg):
    """This rank's groups from helpers.runtime.mesh by hand and from init_device_mesh."""
    import helpers.runtime.mesh as mesh
    shape, names = tuple(cfg["shape"]), tuple(cfg["names"])
    # the members of the group itself, not only the list new_groups says it used
    groups = mesh.new_groups(shape, names)
    by_hand = {name: dist.get_process_group_ranks(group) for name, (group, _) in groups.items()}
    listed = {name: ranks for name, (_, ranks) in groups.items()}
    assert listed == by_hand, f"new_groups built {by_hand} but says {listed}"
    dm = mesh.device_mesh(shape, names, "cpu")
    by_torch = {name: dist.get_process_group_ranks(dm[name].get_group()) for name in names}
    coords = {name: dm[name].get_local_rank() for name in names}
    return by_hand, by_torch, coords


def sendrecv_pairs(rank, world, cfg):
    """DistComm.sendrecv as a pipeline uses it on real ranks: both ranks sending and receiving
    at once, a send alone, a receive alone (every send held until wait()); returns what
    arrived and how many sends were held."""
    from helpers.runtime.comm import DistComm
    comm, peer = DistComm(), 1 - rank
    x = torch.full((4,), float(rank + 1))
    got = [float(comm.sendrecv((x * k, peer), (peer, (4,)))[0]) for k in range(1, 4)]
    if rank == 0:
        comm.sendrecv((x, 1))
        held = len(comm._pending)
        back = comm.sendrecv(recv=(1, (4,)))
    else:
        a = comm.sendrecv(recv=(0, (4,)))
        back, held = comm.sendrecv((a * 3, 0)), len(comm._pending)
    comm.wait()
    return got, back if back is None else float(back[0]), held, len(comm._pending)


def exit_quietly_on_rank_1(rank, world, cfg):
    """Rank 1 ends its process with code 0 before returning: no result is handed in."""
    if rank == 1:
        os._exit(0)
    return rank


def future_values(rank, world, cfg):
    """What each async collective's `get_future()` resolves to, and its Work's `result()` and
    `is_completed()` after that, run on gloo ranks or on the checks' World: per call, its
    tensors named by the argument each is (or is a view of), with their shapes and sums."""
    t = torch.full((4,), float(rank + 1))
    outs, ins = [torch.zeros(4) for _ in range(world)], [torch.ones(4) for _ in range(world)]
    big, small, src = torch.zeros(4 * world), torch.zeros(4), torch.ones(4 * world)
    names = dict(t=t, outs0=outs[0], outs1=outs[1], big=big, small=small)
    calls = dict(
        all_reduce=lambda: dist.all_reduce(t, async_op=True),
        broadcast=lambda: dist.broadcast(t, 0, async_op=True),
        all_gather=lambda: dist.all_gather(outs, t, async_op=True),
        all_gather_into_tensor=lambda: dist.all_gather_into_tensor(big, t, async_op=True),
        all_to_all=lambda: dist.all_to_all(outs, ins, async_op=True),
        all_to_all_single=lambda: dist.all_to_all_single(big, src, async_op=True),
        barrier=lambda: dist.barrier(async_op=True))

    def name(x):
        same = [n for n, a in names.items() if a is x]
        views = [n for n, a in names.items()
                 if a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()]
        return same[0] if same else f"view of {views[0]}" if views else "new"
    got = {}
    for op, call in calls.items():
        work = call()
        value = work.get_future().wait()
        got[op] = [(name(x), tuple(x.shape), float(x.sum())) for x in value]
        work.wait()                     # gloo's result() needs the Work itself completed
        got[op + " result"] = ([(name(x), tuple(x.shape), float(x.sum())) for x in work.result()],
                               work.is_completed())
    return got
