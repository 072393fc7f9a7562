"""torch.distributed's process groups in the simulated world (dist.py plays the calls). On
torch, `new_group` is entered by every rank of the default group, members or not, in the same
order and with the same ranks (the group's name comes from a counter: a rank that creates only
its own group builds it under another group's name, and sums come out wrong or the connection
resets); with `use_local_synchronization=True` only the members enter it. So it is played as a
collective of those ranks that fails the answer, naming the rule, when their ranks differ (a rank
that never calls it leaves the others in a deadlock, waits.py's words). A rank outside the group
gets torch's `GroupMember.NON_GROUP_MEMBER`, on which a call does what torch's does."""
import operator

import torch.distributed as dist

__all__ = ["Group", "new_group", "ranks_of", "outside_answer", "NEW_GROUP_RULE"]

NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER
NEW_GROUP_RULE = (
    "dist.new_group is entered by every rank of the default group, members of the new group or "
    "not, in the same order and with the same ranks (on processes a rank that creates only its "
    "own group builds it under another group's name: wrong sums or a reset connection). Create "
    "every group on every rank, in one order, and keep the one that holds this rank; or pass "
    "use_local_synchronization=True, and then only the group's members call it")
# torch's answer on NON_GROUP_MEMBER: -1 for these, None for every collective and send
_OUTSIDE = {"get_rank": -1, "get_world_size": -1, "recv": -1}


class Group:
    """A process group of the simulated world (dist.new_group, a mesh's get_group)."""

    def __init__(self, ranks):
        self.ranks = list(ranks)

    def size(self):
        return len(self.ranks)

    def rank(self):
        r = dist.get_rank()
        return self.ranks.index(r) if r in self.ranks else -1

    def __repr__(self):
        return f"Group({self.ranks})"


def _outside(group):
    return type(group) is int and group == NON_MEMBER


def ranks_of(W, group):
    """The world ranks of `group` (None or the default group: all of them)."""
    if isinstance(group, Group):
        return group.ranks
    if _outside(group):
        raise ValueError(f"rank {W.rank} is not a member of this group: dist.new_group gave it "
                         "GroupMember.NON_GROUP_MEMBER")
    return list(range(W.size))


def outside_answer(name, fn, W, args, kwargs):
    """(True, torch's return value) when call `name` (`fn(W, ...)`) names NON_GROUP_MEMBER as its
    group, which torch answers without communicating; else (False, None)."""
    code = fn.__code__ if hasattr(fn, "__code__") else None
    names = code.co_varnames[1:code.co_argcount] if code is not None else ()
    if "group" not in names:
        return False, None
    at = names.index("group")
    group = kwargs["group"] if "group" in kwargs else args[at] if at < len(args) else None
    if not _outside(group):
        return False, None
    if name in ("get_global_rank", "get_process_group_ranks", "get_backend"):
        ranks_of(W, group)          # raises, naming it
    return True, _OUTSIDE.get(name)


def _valid(ranks, size):
    """torch's checks of a new group's ranks, in its words."""
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks list must not contain duplicate entries, got {ranks}")
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(f"Rank {r} is out of range. Valid ranks are 0 to {size - 1} "
                             f"(world_size={size})")


def new_group(W, ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None, sort_ranks=True):
    """torch's new_group on a thread rank: a meeting of every rank of the default group (with
    use_local_synchronization=True, of the group's members), whose ranks lists must agree."""
    rank, local = W.rank, bool(use_local_synchronization)
    if ranks is None:
        ranks = list(range(W.size))
    else:
        # an int kept as it is: a count a rank read out of its tensors keeps its rank there
        ranks = [r if isinstance(r, int) else operator.index(r) for r in ranks]
        if local and rank not in ranks:
            return NON_MEMBER               # torch's: a non-member does not enter it
        ranks = sorted(ranks) if sort_ranks else ranks
        _valid(ranks, W.size)
    mine = (tuple(ranks), local)
    how = ", use_local_synchronization=True" if local else ""

    def same(calls):
        if any(c != mine for c in calls):
            W._refuse(rank, f"rank {rank} called dist.new_group({ranks}{how}) where another "
                            f"rank of {'the group' if local else 'the default group'} created "
                            f"a group of other ranks at the same point: {NEW_GROUP_RULE}")
        return [None] * len(calls)
    W.collective("new_group", ranks if local else range(W.size), None, mine, same,
                 lambda _: None)
    return Group(ranks) if rank in ranks else NON_MEMBER


def get_rank(W, group=None):
    if isinstance(group, Group):
        return group.rank()
    return W.rank


def get_world_size(W, group=None):
    return len(ranks_of(W, group))


def get_global_rank(W, group, group_rank):
    return ranks_of(W, group)[group_rank]


def get_process_group_ranks(W, group):
    return list(ranks_of(W, group))
