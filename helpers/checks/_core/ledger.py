"""The harness's own copy of a World's records, kept in closures that nothing handed to an answer
leads to, and compared with the World's readable records when its run ends.

A check judges a World's `messages` (sent(), traffic()), `timeline` (the marks, the order of
calls), its allow-list, `received`, `exits` and `recorders`. The comm, the async handles and the
pipeline's stages hold no attribute that leads to them (runtime/comm.py, thread_world.py's Work,
dist.py), so an answer cannot reach them; should one reach them by a route nobody closed and
erase a message, lift the allow-list, change a message's bytes or forge a received storage, the
records no longer match this copy and the answer fails (`CheckFailed`).

    note, verify, allow = ledger(world)
    note("message", rank, (kind, m))     # as the world logs m
    note("event", rank, (seq, kind, detail)); note("received", rank, keys)
    note("exit", rank, entry); note("recorder", rank, rec); note("failure", rank, (rank, e))
    verify()                             # None, or what differs, in words
"""
from .composite import version_of
from .run import CheckFailed

__all__ = ["ledger", "tampered"]


def _fields(m):
    """What a Message says (the tensor by identity and version): an edit of any of it shows."""
    t = m.tensor
    return (m.op, m.rank, m.src, m.dst, m.ranks, m.tag, m.key, m.shape, m.dtype, m.nbytes,
            m.seq, m.async_op, id(t), None if t is None else version_of(t))


def _same(a, b):
    """Timeline entries (seq, kind, detail): the detail by identity, or equal (a mark's label)."""
    if a is b:
        return True
    try:
        return a[0] == b[0] and a[1] == b[1] and (a[2] is b[2] or bool(a[2] == b[2]))
    except Exception:   # a label that cannot be compared is not the same
        return False


def ledger(world):
    """note(what, rank, item), verify() -> None or the first difference, allow() -> the
    allow-list the world was made with (see the module's docstring)."""
    size = world.size
    messages, waits = [], {}
    lines = [[] for _ in range(size)]
    received = [set() for _ in range(size)]
    exits = [[] for _ in range(size)]
    recorders = [None] * size
    failure = []          # the first call the network refused (world.network_failure)
    allowed = world.allow

    def note(what, rank, item):
        if what == "message":
            messages.append((item[1], _fields(item[1])))
            lines[rank].append((item[1].seq, item[0], item[1]))
        elif what == "event":
            lines[rank].append(item)
            if item[1] == "wait":
                waits[id(item[2])] = item[0]
        elif what == "received":
            received[rank].update(item)
        elif what == "exit":
            exits[rank].append(item)
        elif what == "recorder":
            recorders[rank] = item
        elif what == "failure":
            failure.append(item)

    def verify():
        try:
            return compare()
        except Exception:   # records replaced by something else
            return "its records"

    def compare():
        if world.allow != allowed:
            return "its allow-list"
        if getattr(world, "network_failure", None) is not (failure[0] if failure else None):
            return "the call its network refused"
        got = world.messages
        if len(got) != len(messages) or any(a is not m for a, (m, _)
                                            in zip(got, messages, strict=True)):
            return "its list of messages"
        for m, fields in messages:
            if _fields(m) != fields or m.waited != waits.get(id(m)):
                return f"message {m!r}"
        for r in range(size):
            line = world.timeline[r]
            if len(line) != len(lines[r]) or not all(map(_same, line, lines[r])):
                return f"rank {r}'s timeline"
            if world.received[r] != received[r]:
                return f"what rank {r} received"
            if world.exits[r] != exits[r]:
                return f"what rank {r} read out of torch"
            if world.recorders[r] is not recorders[r]:
                return f"rank {r}'s Recorder"
        return None

    return note, verify, lambda: allowed


def tampered(what):
    """The failure for an answer that changed the records a check judges (`what`, in words)."""
    return CheckFailed(f"the answer changed the grader's records of the run ({what}): an answer "
                       "must do its work through the comm it is handed, not edit what the check "
                       "observes")
