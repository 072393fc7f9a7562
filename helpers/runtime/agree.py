"""Ranks that must run the same collectives, checked: who differs, and who never came.

Collectives pair up by their order alone. A rank that runs another one (another unit's
all-gather, one reduce-scatter more) makes gloo abort the process ("Received data size doesn't
match expected size"), hang, or, where the sizes happen to agree, mix the wrong tensors without
a word. `agree(value)` has every rank of the group post `value` (what it is about to do, or what
it holds) under the next number of the group's sequence in the process group's key-value store,
and read the others': refused, naming each rank's value, when they differ; a TimeoutError naming
the ranks that never came. The store is not a collective: nothing is counted as traffic
(helpers.count_traffic), nothing joins the collectives' order, and a rank that is elsewhere
cannot be paired with the wrong call. `where_are_the_others` names, after a collective timed
out, the ranks that never reached it.
"""
import datetime
import itertools
import zlib
from typing import Any

import torch
import torch.distributed as dist

from ..words import plural_names
from .progress import waiting

__all__ = ["CollectiveMismatch", "agree", "fingerprint", "where_are_the_others"]

SAME_MODEL = "build the same model (and wrap it alike) on every rank"

_numbers = {}   # (store, group's ranks) -> the group's next agreement number


class CollectiveMismatch(RuntimeError):
    """The ranks were about to run different collectives (or hold different models)."""


def _store() -> dist.Store | None:
    """The process group's store, or None without one (thread ranks: nothing to check)."""
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
        if dist.get_backend() == "fake":   # one process plays every rank: no one to ask
            return None
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _ranks(group: dist.ProcessGroup | None) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))


def agree(value: str, group: dist.ProcessGroup | None = None, fix: str = "",
          timeout: float | None = None) -> int | None:
    """Every rank of `group` (all by default) says `value` (a str); returns the agreement's
    number, the same on every rank (None where there is nothing to check: one rank, no store).
    CollectiveMismatch, naming every rank's value and `fix`, when they differ; TimeoutError
    naming the ranks that did not come within `timeout` seconds (default: the process
    group's), and, in a launched rank, its progress says whom it waits for meanwhile."""
    store = _store()
    if store is None:
        return None
    ranks = _ranks(group)
    if len(ranks) == 1:
        return None
    me = dist.get_rank()
    counter = _numbers.setdefault((id(store), ranks), itertools.count())
    n = next(counter)
    name = "-".join(map(str, ranks))
    key = f"course/agree/{name}/{n}/{{}}".format
    store.set(key(me), value)
    others = [key(r) for r in ranks if r != me]
    try:
        with waiting(f"waits for {plural_names([r for r in ranks if r != me], 'rank')} "
                     f"to run {value}"):
            store.wait(others, *([datetime.timedelta(seconds=timeout)] if timeout else []))
    except RuntimeError:   # the store's timeout (the process group's)
            missing = [r for r in ranks if r != me and not store.check([key(r)])]
            raise TimeoutError(
                f"rank {me} was about to run {value}, but {plural_names(missing, 'rank')} did "
                f"not get there in time: every rank must run the same collectives in the same "
                f"order; {'it' if len(missing) == 1 else 'they'} skipped this one, took another "
                f"path, or stopped"
                f"{'. ' + fix if fix else ''}") from None
    got = store.multi_get(others) if hasattr(store, "multi_get") else \
        [store.get(k) for k in others]
    said = dict(zip((r for r in ranks if r != me), (v.decode() for v in got), strict=True))
    said[me] = value
    if n:   # every rank has read my previous value: it got here only after reading it
        store.delete_key(key(me).replace(f"/{n}/", f"/{n - 1}/"))
    if len(set(said.values())) > 1:
        told = "; ".join(f"rank {r}: {said[r]}" for r in ranks)
        raise CollectiveMismatch(f"the ranks are not running the same collectives ({told})"
                                 f"{': ' + fix if fix else ''}")
    return n


def fingerprint(what: str, *parts: Any) -> str:
    """`what`, the number of tensors in `parts` and a checksum of them all: a module gives each
    parameter's and buffer's name, shape, dtype and requires_grad; a tensor its shape and dtype;
    anything else its repr. Ranks that must hold the same model agree on it."""
    plan = []
    for part in parts:
        if isinstance(part, torch.nn.Module):
            plan += [(n, tuple(t.shape), str(t.dtype), t.requires_grad)
                     for n, t in [*part.named_parameters(), *part.named_buffers()]]
        elif isinstance(part, torch.Tensor):
            plan.append((tuple(part.shape), str(part.dtype)))
        elif isinstance(part, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in part):
            plan += [(tuple(t.shape), str(t.dtype)) for t in part]
        else:
            plan.append(repr(part))
    tensors = sum(isinstance(p, tuple) for p in plan)
    return f"{what} ({tensors} tensors, fingerprint {zlib.crc32(repr(plan).encode()):08x})"


def where_are_the_others(here: str, topic: str, group: dist.ProcessGroup | None = None,
                         wait: float = 3.0) -> str:
    """After a collective about `topic` timed out on this rank: post `here` (where this rank
    is) and collect, for at most `wait` seconds, where the other ranks whose collectives timed
    out say they are. Returns a sentence naming each, and the ranks that said nothing (they
    never reached a collective of `topic`: they skipped it, or left)."""
    store = _store()
    if store is None:
        return ""
    ranks, me = _ranks(group), dist.get_rank()
    key = f"course/stuck/{topic}/{{}}".format
    others = [r for r in ranks if r != me]
    try:
        store.set(key(me), here)
        try:
            store.wait([key(r) for r in others], datetime.timedelta(seconds=wait))
        except RuntimeError:
            pass
        said = {r: store.get(key(r)).decode() for r in others if store.check([key(r)])}
    except RuntimeError:   # the store is gone too (the rank that held it died)
        return ""
    silent = [r for r in others if r not in said]
    parts = [f"rank {r} is stuck at {v}" for r, v in said.items()]
    if silent:
        parts.append(f"{plural_names(silent, 'rank')} never got there (skipped it, or left)")
    return "; ".join(parts)
