"""How a run of ranks fails, for every way ranks start (processes or threads, runtime.launch and
runtime.thread_world): the one RankFailed, LaunchTimeout, and a thread world's Deadlock."""

from ..words import plural_names

__all__ = ["RankFailed", "LaunchTimeout", "Deadlock"]

TAIL = 8    # the traceback (and stderr) lines a RankFailed quotes


class RankFailed(RuntimeError):
    """A rank raised or died. `rank`, `cause` (one line), `tail` (its last traceback lines),
    `stderr` (its last lines on stderr: what gloo says before it aborts a process);
    `original`: the exception itself when the ranks were threads."""

    def __init__(self, rank, cause, tail="", original=None, stderr=""):
        self.rank, self.cause, self.tail, self.original = rank, cause, tail, original
        self.stderr = stderr
        msg = f"rank {rank} failed: {cause}"
        if stderr:
            msg += f"\n--- the end of rank {rank}'s stderr ---\n{stderr}"
        if tail:
            msg += f"\n--- the end of rank {rank}'s traceback ---\n{tail}"
        super().__init__(msg)


class LaunchTimeout(TimeoutError):
    """Ranks still running after the launch's timeout. `ranks`: which. Process ranks have been
    killed; thread ranks cannot be, so each stops at its next comm call (threads=True)."""

    def __init__(self, ranks, timeout, progress="", threads=False):
        self.ranks, self.timeout = ranks, timeout
        how = "each stops at its next comm call" if threads else "stopped"
        super().__init__(f"{plural_names(ranks, 'rank')} still running after {timeout:g} s "
                         f"({how}){progress}: a rank waits for a message or a collective "
                         "that never comes, or the run needs more time (launch(..., timeout=...))")


SEND_FIX = ("post the receives before waiting for the sends: comm.sendrecv / isendrecv, or "
            "receive before comm.wait() (with torch.distributed: irecv before the isend's "
            "wait(), or batch_isend_irecv)")


class Deadlock(TimeoutError):
    """Every rank of a thread world still running is blocked and none can go on: on processes
    they would hang until the backend's timeout. `blocked`: {rank: its blocking call, in
    words}; `returned`: the ranks that had already returned."""

    def __init__(self, blocked, returned=()):
        self.blocked, self.returned = dict(blocked), list(returned)
        calls = "; ".join(f"rank {r} {what}" for r, what in sorted(self.blocked.items()))
        gone = (f" ({plural_names(self.returned, 'rank')} already returned)"
                if self.returned else "")
        sends = any("to be received" in what for what in self.blocked.values())
        why = (" On processes a send completes only once its peer receives it (gloo and NCCL "
               "alike), so a rank that waits for its sends before posting its receives waits "
               f"for a peer that does the same: {SEND_FIX}" if sends else
               " Each receive needs a matching send, in the same order, and every rank must "
               "reach each collective")
        super().__init__(f"deadlock: every rank still running is blocked and none can go on"
                         f"{gone}: {calls}.{why}")
