"""THE one place that rebinds torch.distributed's functions: `intercept(names, on_call)` wraps
them for a block, calling `on_call` around each call (count_traffic counts bytes with it; the
FSDP2 offload run and the SyncBatchNorm recording record calls). The rebinding is process-wide,
so a rank of a ThreadWorld is refused (tests/test_one_home.py keeps every other module off it)."""
import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch.distributed as dist

__all__ = ["intercept", "in_rank_thread"]

RANK_THREAD = threading.local()   # .rank: set by ThreadWorld in each of its rank threads

After = Callable[[Any], None]     # called with a call's result


def in_rank_thread() -> bool:
    """Whether the calling thread is a rank of a ThreadWorld (process-wide state is shared)."""
    return getattr(RANK_THREAD, "rank", None) is not None


@contextlib.contextmanager
def intercept(names: Iterable[str], on_call: Callable[[str, tuple, dict], After | None],
              who: str = "intercept") -> Iterator[None]:
    """Inside the block, each of torch.distributed's functions `names` lists (those it has) runs
    `on_call(name, args, kwargs)` first, and what that returns, unless None, with the result
    after. A nested block wraps the outer one's wrappers and puts them back, so both see each
    call; every function is restored on leaving, exception or not. `who` names the caller in the
    refusal a thread rank gets (ranks nesting blocks would restore each other's wrappers)."""
    if in_rank_thread():
        raise RuntimeError(f"{who} rebinds torch.distributed for the whole process, so thread "
                           "ranks would undo each other's counting: read the rank's "
                           "comm.traffic (a property) instead")
    saved = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    for name, fn in saved.items():
        setattr(dist, name, _wrapped(name, fn, on_call))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _wrapped(name: str, fn: Callable, on_call) -> Callable:
    """fn, with on_call run before it and its returned callback after it."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        after = on_call(name, args, kwargs)
        result = fn(*args, **kwargs)
        if after is not None:
            after(result)
        return result
    return wrapper
