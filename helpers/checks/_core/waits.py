"""Every async call a World's rank launches is waited for by that rank before it returns: an
async collective (`async_op=True`), an isend, an irecv, a Work whose future was taken, and a
comm's send (`comm.send`, the sends of `isendrecv` and `sendrecv`). The simulated Work
completes as every rank launched it (runtime/work.py) and a thread rank's send is copied as it
is posted, so an answer that never waits gets the right values here; on gloo the result lands
from a background thread, on NCCL on the communication stream, so reading it unwaited is a
race, and a DistComm keeps each send, its tensor held, until its `wait()`. The wait counts where
the rank first observed completion (`wait()`, `result()`, `is_completed()`, its future, a future
chained from it with `then()`, `torch.futures.wait_all`), as work.py records it, and for a
comm's send where the rank calls `comm.wait()` (isendrecv's: the Exchange's `wait()`). A wait
for a send returns only once the peer received it (runtime/thread_waits.py: a wait no receive
can meet is a Deadlock), so a recorded send wait is also one a real backend completes.
A Deadlock is the answer's failure whichever rank found it (`answers_deadlock`); one where a rank
waits in dist.new_group adds new_group's rule and its fix (groups.py)."""
from ...runtime.errors import Deadlock
from .groups import NEW_GROUP_RULE
from .run import CheckFailed

__all__ = ["never_waited", "what", "comm_what", "answers_deadlock", "DeadlockFailed"]


class DeadlockFailed(CheckFailed, Deadlock):
    """The answer's ranks deadlocked: a CheckFailed (the answer failed, never the check, even
    when the last rank to return found it and no frame of the answer's is in its traceback)
    and the runtime's Deadlock, with its words (each rank's blocking call, who returned)."""

    def __init__(self, blocked, returned=(), left=None):
        Deadlock.__init__(self, blocked, returned, left)
        if any(" in new_group " in w for w in self.blocked.values()):   # groups.py's meeting
            self.args = (f"{self.args[0].rstrip('.')}. {NEW_GROUP_RULE}",)


def answers_deadlock(error):
    """`error` as a DeadlockFailed when it is a Deadlock, else `error` itself."""
    if isinstance(error, Deadlock) and not isinstance(error, DeadlockFailed):
        return DeadlockFailed(error.blocked, error.returned, error.left).with_traceback(
            error.__traceback__)
    return error

_COMM_FIX = {
    "send": "call comm.wait() before the rank returns",
    "isendrecv": "call the wait() of the Exchange isendrecv returned (after a sendrecv: "
                 "comm.wait()) before the rank returns"}


def what(rank, m):
    """Message `m` of rank `rank` in the reader's words ("rank 0's isend to rank 1")."""
    if m.op == "send":
        return f"rank {rank}'s isend to rank {m.dst}"
    if m.op == "irecv":
        return f"rank {rank}'s irecv from rank {m.src}"
    return f"rank {rank}'s {m.op} with async_op=True"


def comm_what(rank, m, call):
    """Message `m`, posted by rank `rank`'s comm call `call`, in the reader's words."""
    how = "comm.send" if call == "send" else f"{call} send"
    return f"rank {rank}'s {how} to rank {m.dst}"


def never_waited(world):
    """[(rank, CheckFailed)] for the first rank (in rank order) that ended with async work it
    never waited for (its messages, the irecvs dist.py keeps in `world.irecvs`, the comm's sends
    world.py keeps in `world.comm_sends`), else []."""
    for r in range(world.size):
        left = [m for m in world.messages if m.rank == r and m.async_op and m.waited is None]
        left += [m for m in world.irecvs[r] if m.waited is None]
        sends = [(m, call) for m, call in world.comm_sends[r] if m.waited is None]
        if not left and not sends:
            continue
        n = len(left) + len(sends)
        more = f" (and {n - 1} more async call(s))" if n > 1 else ""
        if left:
            return [(r, CheckFailed(
                f"{what(r, left[0])} was never waited for{more}: call work.wait() (or "
                "future.wait()) before using the result, and before the rank returns. Until "
                "then a real backend may not have finished it (gloo completes it on a "
                "background thread, NCCL on its own stream): the result may not have arrived, "
                "an isend's tensor may still be in use"))]
        m, call = sends[0]
        return [(r, CheckFailed(
            f"{comm_what(r, m, call)} was never waited for{more}: {_COMM_FIX[call]}. A "
            "send returns at once and the comm's wait finishes it: on processes (gloo, NCCL) "
            "it may still be reading its tensor until then, and the comm holds every send "
            "not yet waited for"))]
    return []
