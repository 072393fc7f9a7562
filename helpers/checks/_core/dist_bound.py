"""torch.distributed's functions reach the simulated world however the answer bound them: a name
imported before the check ran (`from torch.distributed import all_reduce`), one reached through
`distributed_c10d`, or a default argument hold torch's own function objects, which the module's
rebinding (dist.py) misses. So, while a world runs, each such function gets a code that hands
the call to the world from its rank threads and runs torch's own code from any other thread
(as stubs.py does for the course's references). torch's older names route to the call they
became; the collectives the world does not play are refused by name, with the calls it plays."""
import contextlib
import types

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .dist import _CALLS, _dispatch
from .run import CheckFailed
from .stubs import codes_routed
from .whose import forwarding_code

__all__ = ["bound_routed", "unplayed", "unplayed_words"]

# torch's names from before 2.0 for the tensor forms: the same arguments, the same call
ALIASES = {"_reduce_scatter_base": "reduce_scatter_tensor",
           "_all_gather_base": "all_gather_into_tensor"}
# answered at the module's attribute only (dist.py): torch's own code asks them to decide whether
# its process-group tables exist (`_get_default_store` after is_initialized()), which no rank has
MODULE_ONLY = ("is_initialized", "get_backend", "new_group")
# collectives with no played form: refused by name from a rank
REFUSED = ("all_gather_coalesced", "all_gather_object",
           "gather_object", "scatter_object_list", "broadcast_object_list", "gather", "scatter",
           "monitored_barrier", "reduce_scatter_tensor_coalesced")
PLAYED = ("dist.all_reduce, dist.reduce, dist.broadcast, dist.all_gather, "
          "dist.all_gather_into_tensor, dist.reduce_scatter, dist.reduce_scatter_tensor, "
          "dist.all_to_all, dist.all_to_all_single, dist.barrier, send/recv, isend/irecv, "
          "batch_isend_irecv, with async_op=True too")


def unplayed_words(name):
    """The words for a call of torch.distributed's `name` the world does not play."""
    return (f"your code called torch.distributed.{name}, which the check's simulated world does "
            f"not play (it has no process group to run it on): it plays {PLAYED}. Use one of "
            "those; the exercise names the one it asks for")


_ROUTED = {}            # key -> the call the function's code hands over to (bound_routed)


def _hit(key, args, kwargs, *, _ROUTED=_ROUTED):
    """A call of a routed function, bound however early: the world's call from a rank thread
    (the dispatch decides), torch's own code otherwise."""
    return _ROUTED[key](*args, **kwargs)


def _coalesced(own, world):
    """all_reduce_coalesced of one tensor is that tensor's all-reduce (one message either way);
    of several, one message the world cannot play: refused by name."""
    reduce = _dispatch("all_reduce", None, world)

    def call(tensors, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if world.rank is None:
            return own(tensors, op, group, async_op)
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if len(tensors) != 1:
            raise CheckFailed(unplayed_words("all_reduce_coalesced") + " (of one tensor, "
                              "it plays it as dist.all_reduce)")
        return reduce(tensors[0], op=op, group=group, async_op=async_op)
    return call


def _refuser(name, own, world):
    def call(*args, **kwargs):
        if world.rank is not None:
            raise CheckFailed(unplayed_words(name))
        return own(*args, **kwargs)
    return call


def _functions():
    """(name, torch's function object) for distributed_c10d's public functions (the objects
    torch.distributed exports), torch's older names and the refused collectives."""
    for name in sorted(set(vars(distributed_c10d)) | set(ALIASES) | set(REFUSED)):
        fn = vars(distributed_c10d).get(name)    # read as held: no deprecated object's warning
        if type(fn) is types.FunctionType and fn.__module__.startswith("torch."):
            yield name, fn


@contextlib.contextmanager
def bound_routed(world, *, _ROUTED=_ROUTED):
    """While `world` runs: each of torch's functions the world plays (dist.py's _CALLS), their
    ALIASES and REFUSED get a code that hands the call to dist.py's dispatch (torch's own code
    from any other thread) or refuses it from a rank."""
    names, codes = {}, {}
    for name, fn in _functions():
        played = ALIASES.get(name, name)
        routed = played in _CALLS or name in REFUSED or name == "all_reduce_coalesced"
        if routed and (name in ALIASES or name[0] != "_") and name not in MODULE_ONLY:
            names[fn], codes[fn] = name, forwarding_code(
                len(fn.__code__.co_freevars), name, __name__, "_hit", f"{id(fn)}:{name}",
                __file__)
    with codes_routed(codes) as own:    # one world at a time (dist.py's torch_distributed)
        for fn, name in names.items():
            played = ALIASES.get(name, name)
            _ROUTED[f"{id(fn)}:{name}"] = (
                _dispatch(played, own[fn], world) if played in _CALLS
                else _coalesced(own[fn], world) if name == "all_reduce_coalesced"
                else _refuser(name, own[fn], world))
        try:
            yield
        finally:
            for fn, name in names.items():
                _ROUTED.pop(f"{id(fn)}:{name}", None)


_NO_GROUP = "Default process group has not been initialized"


def unplayed(error):
    """A CheckFailed naming the calls the world plays, for torch's "no default process group"
    error that a call the world does not route raised in a rank; else `error` itself."""
    if isinstance(error, (ValueError, RuntimeError)) and _NO_GROUP in str(error):
        return CheckFailed(f"your code called {_torch_call(error)}, which the check's simulated "
                           f"world does not play (torch raised: {_NO_GROUP}): it plays {PLAYED}, "
                           "called from a rank's own thread or a thread it starts. Use one of "
                           "those")
    return error


def _torch_call(error):
    """The call of torch.distributed's the reader's code made, from the error's traceback: the
    outermost public torch.distributed function, else the outermost one of its private ones
    (`distributed_c10d._get_default_group`, `_coalescing_manager`), else words for a call with
    no Python frame of torch.distributed (a ProcessGroup method is C++)."""
    private = None
    tb = error.__traceback__
    while tb is not None:
        code, module = tb.tb_frame.f_code, tb.tb_frame.f_globals.get("__name__", "")
        if type(module) is str and module.startswith("torch.distributed") and \
                code.co_name != "wrapper":
            if not code.co_name.startswith("_"):
                return f"torch.distributed.{code.co_name}"
            private = private or f"{module}.{code.co_name}"
        tb = tb.tb_next
    return private or "a torch.distributed call (a ProcessGroup method, in torch's C++)"


del _ROUTED
