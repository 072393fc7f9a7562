"""A thread world's sends, waited for as on processes (thread_world.py's ThreadWorld mixes this
in): a send completes once its peer has posted the matching receive (gloo's and NCCL's rule), so
a wait for a send blocks until then, and when every rank still running is blocked with nothing
deliverable the run fails at once with a Deadlock naming each rank's blocking call, where
processes would hang until the backend's timeout. It uses the world's lock and records:
`_cond`, `_claimed`, `_blocked`, `_live`, `_failed`, `_wait`, `fail`, `rank`, `size`."""
from .errors import Deadlock

__all__ = ["SendWaits"]


class SendWaits:
    """received / wait_received / post_recv for a ThreadWorld, and its deadlock test. Each
    blocked rank's entry: (ready, its call in words, its kind, the ranks it waits for)."""

    def send_received(self, m):
        """Whether send `m` has met its receive: the peer posted one for it (a recv, an
        irecv, an isendrecv's), as a gloo or NCCL send completes."""
        with self._cond:
            return m.index < self._claimed[(m.src, m.dst, m.tag)]

    def wait_received(self, m, call):
        """Block the calling rank until send `m` has met its receive (`send_received`): what a wait
        for a send does on processes. `call`: the waiting call in words ("comm.wait()")."""
        self._enter()
        with self._cond:
            self._wait(lambda: m.index < self._claimed[(m.src, m.dst, m.tag)],
                       f"its send to rank {m.dst} (tag {m.tag}) to be received",
                       f"waits in {call} for its send to rank {m.dst} (tag {m.tag}) "
                       "to be received", "send", lambda: [m.dst])

    def post_recv(self, src, tag=0):
        """The calling rank posts a receive from `src` (an irecv, an isendrecv's): it meets the
        next message of that channel as posted, though `recv(..., posted=True)` takes it later."""
        with self._cond:
            self._claimed[(src, self.rank, tag)] += 1
            self._cond.notify_all()

    def _deadlocked(self):
        """Under the lock: when every rank still running is blocked and none of their waits
        can end, fail the run with a Deadlock naming each rank's blocking call (returned)."""
        live = set(self._live)
        if (not live or self._failed is not None or not live <= set(self._blocked)
                or any(self._blocked[r][0]() for r in live)):
            return None
        gone = set(range(self.size)) - live
        error = Deadlock({r: self._blocked[r][1] for r in live}, sorted(gone),
                         {r: (self._blocked[r][2], sorted(set(self._blocked[r][3]()) & gone))
                          for r in live})
        self.fail(min(live), error)
        return error

    def _woken(self, rank):
        """What a rank woken by the run's failure raises in its own call: the Deadlock that
        names its call (a copy, its traceback this rank's), or None (it stops quietly). A
        deadlock found as the last other rank returned is this rank's to report: its call is
        where the answer waits for ever."""
        error = self._failed[1] if self._failed is not None else None
        if isinstance(error, Deadlock) and rank in error.blocked:
            return error.copy()
        return None
