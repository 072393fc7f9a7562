"""How a run of ranks fails, for every way ranks start (processes or threads, runtime.launch and
runtime.thread_world): the one RankFailed, and LaunchTimeout."""

from ..words import plural_names

__all__ = ["RankFailed", "LaunchTimeout"]

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
