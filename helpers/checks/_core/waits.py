"""Every async call a World's rank launches is waited for by that rank before it returns: an
async collective (`async_op=True`), an isend, an irecv, a Work whose future was taken. The
simulated Work completes as every rank launched it (runtime/work.py), so an answer that never
waits gets the right values here; on gloo the result lands from a background thread, on NCCL
on the communication stream, so reading it unwaited is a race. The wait counts where the rank
first observed completion (`wait()`, `result()`, `is_completed()`, its future, a future chained
from it with `then()`, `torch.futures.wait_all`), as work.py records it."""
from .run import CheckFailed

__all__ = ["never_waited", "what"]


def what(rank, m):
    """Message `m` of rank `rank` in the reader's words ("rank 0's isend to rank 1")."""
    if m.op == "send":
        return f"rank {rank}'s isend to rank {m.dst}"
    if m.op == "irecv":
        return f"rank {rank}'s irecv from rank {m.src}"
    return f"rank {rank}'s {m.op} with async_op=True"


def never_waited(world):
    """[(rank, CheckFailed)] for the first rank (in rank order) that ended with async work it
    never waited for (its messages, and the irecvs dist.py keeps in `world.irecvs`), else []."""
    for r in range(world.size):
        left = [m for m in world.messages if m.rank == r and m.async_op and m.waited is None]
        left += [m for m in world.irecvs[r] if m.waited is None]
        if left:
            more = f" (and {len(left) - 1} more async call(s))" if len(left) > 1 else ""
            return [(r, CheckFailed(
                f"{what(r, left[0])} was never waited for{more}: call work.wait() (or "
                "future.wait()) before using the result, and before the rank returns. Until "
                "then a real backend may not have finished it (gloo completes it on a "
                "background thread, NCCL on its own stream): the result may not have arrived, "
                "an isend's tensor may still be in use"))]
    return []
