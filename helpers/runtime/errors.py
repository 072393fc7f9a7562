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
    words}; `returned`: the ranks that had already returned; `left`: {rank: (kind, the returned
    ranks its call waits for)}, kind "send" (a send waiting to be received), "recv" or
    "collective": a peer that returned will never take part, whatever the others do."""

    def __init__(self, blocked, returned=(), left=None):
        # kept as plain tuples: an exception out of a check's answer is kept only if its
        # attributes are plain data (helpers/checks/_core/raised.py), else retyped
        self._calls = tuple(sorted((int(r), str(w)) for r, w in dict(blocked).items()))
        self._returned = tuple(int(r) for r in returned)
        self._left = tuple(sorted((int(r), str(kind), tuple(int(g) for g in gone))
                                  for r, (kind, gone) in dict(left or {}).items() if gone))
        calls = "; ".join(f"rank {r} {what}{self._gone(r)}"
                          for r, what in sorted(self.blocked.items()))
        gone = (f" ({plural_names(self.returned, 'rank')} already returned)"
                if self.returned else "")
        kinds = {kind for kind, _ in self.left.values()}
        sends = any("to be received" in what for what in self.blocked.values())
        why = (" A send completes only once its peer receives it: a rank that returns without "
               "receiving a message sent to it leaves its sender waiting for ever. Each send "
               "needs a matching receive on its peer (the same tag, in the same order)"
               if "send" in kinds else
               " Every rank of a group must make the same collective calls, in the same "
               "order: a call only some ranks make, or a rank that returns early, leaves the "
               "others waiting" if "collective" in kinds else
               " Each receive needs a matching send, in the same order: a rank that returned "
               "sends nothing more" if kinds else
               " On processes a send completes only once its peer receives it (gloo and NCCL "
               "alike), so a rank that waits for its sends before posting its receives waits "
               f"for a peer that does the same: {SEND_FIX}" if sends else
               " Each receive needs a matching send, in the same order, and every rank must "
               "reach each collective")
        super().__init__(f"deadlock: every rank still running is blocked and none can go on"
                         f"{gone}: {calls}.{why}")

    blocked = property(lambda self: dict(self._calls), doc="{rank: its blocking call}")
    returned = property(lambda self: list(self._returned), doc="the ranks that returned")
    left = property(lambda self: {r: (kind, list(gone)) for r, kind, gone in self._left},
                    doc="{rank: (kind, the returned ranks its call waits for)}")

    def _gone(self, rank):
        """', but rank 1 returned without receiving it' for a call whose peer returned."""
        if rank not in self.left:
            return ""
        kind, gone = self.left[rank]
        did = {"send": "receiving it", "recv": "sending it"}.get(kind, "calling it")
        return f", but {plural_names(gone, 'rank')} returned without {did}"

    def copy(self):
        """The same Deadlock afresh, for another rank to raise in its own call."""
        return type(self)(self.blocked, self.returned, self.left)
