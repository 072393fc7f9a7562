"""torch.distributed, played by a World's threads (world.py): while `torch_distributed(world)` is
active, `dist.<call>` from a rank's thread goes to the world (from any other thread, to torch's
own function). Every correct form of a call is accepted: list and tensor forms of
reduce_scatter and all_gather, async_op=True, groups from new_group (groups.py: a call of every
rank, as on torch), the ReduceOp of the call.
Each call takes the World as its first argument, from the closure `_dispatch` makes: no module
global holds the World (an answer could import it and edit the records the check judges).
"""
import contextlib
import os
import threading
import types

import torch
import torch.distributed as dist

from ...runtime.comm import wire as _wire
from ...runtime.work import Work, WorkFuture, waited_all
from . import groups as _groups
from .buffers import copy_each, copy_into
from .groups import Group
from .groups import outside_answer as _outside_answer
from .groups import ranks_of as _ranks
from .inflight import launched as _launched
from .raised import traceback_of as _traceback_of
from .run import CheckFailed, stand_in
from .waits import what as _what

__all__ = ["torch_distributed", "Group", "not_simulated"]

_ONE = threading.Lock()     # held while a World stands in for torch.distributed (one at a time)


def _reduce(op, tensors):
    op = dist.ReduceOp.SUM if op is None else op
    stacked = torch.stack([t.to(tensors[0].dtype) for t in tensors])
    if op == dist.ReduceOp.SUM:
        return stacked.sum(0)
    if op == dist.ReduceOp.AVG:
        return stacked.sum(0) / len(tensors)
    if op == dist.ReduceOp.MAX:
        return stacked.max(0).values
    if op == dist.ReduceOp.MIN:
        return stacked.min(0).values
    if op == dist.ReduceOp.PRODUCT:
        return stacked.prod(0)
    raise ValueError(f"the simulated world does not implement reduce op {op}")


def _snap(t):
    return _wire(t)


def _copy_into(out):
    return lambda value: out.copy_(value.reshape(out.shape).to(out.dtype))


# --- the calls ----------------------------------------------------------------------------------
def all_reduce(W, tensor, op=None, group=None, async_op=False):
    ranks = _ranks(W, group)
    return W.collective("all_reduce", ranks, tensor, _snap(tensor),
                             lambda ps: [_reduce(op, ps)] * len(ps), _copy_into(tensor), async_op,
                             value=lambda: [tensor])


def broadcast(W, tensor, src=0, group=None, async_op=False, group_src=None):
    ranks = _ranks(W, group)
    src = ranks[group_src] if group_src is not None else src
    return W.collective("broadcast", ranks, tensor, _snap(tensor),
                             lambda ps: [ps[ranks.index(src)]] * len(ps), _copy_into(tensor),
                             async_op, value=lambda: [tensor])


def reduce(W, tensor, dst=0, op=None, group=None, async_op=False, group_dst=None):
    ranks = _ranks(W, group)
    dst = ranks[group_dst] if group_dst is not None else dst
    mine = W.rank

    def deliver(value):
        if mine == dst:
            tensor.copy_(value)
    return W.collective("reduce", ranks, tensor, _snap(tensor),
                             lambda ps: [_reduce(op, ps)] * len(ps), deliver, async_op,
                             value=lambda: [tensor])


def all_gather(W, tensor_list, tensor, group=None, async_op=False):
    ranks = _ranks(W, group)
    if len(tensor_list) != len(ranks):
        raise ValueError(f"all_gather: {len(tensor_list)} output tensors for {len(ranks)} ranks")
    return W.collective("all_gather", ranks, tensor, _snap(tensor),
                             lambda ps: [ps] * len(ps), copy_each(W, "all_gather", tensor_list),
                             async_op, value=lambda: list(tensor_list))


def all_gather_into_tensor(W, output_tensor, input_tensor, group=None, async_op=False):
    ranks = _ranks(W, group)
    if output_tensor.numel() != input_tensor.numel() * len(ranks):
        raise ValueError(f"all_gather_into_tensor: the output has {output_tensor.numel()} "
                         f"elements, the input {input_tensor.numel()}: the output must be world "
                         f"({len(ranks)}) times the input")
    return W.collective("all_gather", ranks, input_tensor, _snap(input_tensor),
                             lambda ps: [torch.cat([p.reshape(-1) for p in ps])] * len(ps),
                             copy_into(W, "all_gather_into_tensor", output_tensor), async_op,
                             value=lambda: list(output_tensor.chunk(len(ranks))))


def reduce_scatter(W, output, input_list, op=None, group=None, async_op=False):
    ranks = _ranks(W, group)
    if len(input_list) != len(ranks):
        raise ValueError(f"reduce_scatter: {len(input_list)} input tensors for {len(ranks)} ranks")
    flat = torch.cat([t.detach().reshape(-1) for t in input_list])
    sizes = [t.numel() for t in input_list]

    def combine(ps):
        parts = [p.split(sizes) for p in ps]
        return [_reduce(op, [part[i] for part in parts]) for i in range(len(ps))]
    return W.collective("reduce_scatter", ranks, flat, _wire(flat), combine,
                             copy_into(W, "reduce_scatter", output), async_op,
                             value=lambda: [output])


def reduce_scatter_tensor(W, output, input, op=None, group=None, async_op=False):
    ranks = _ranks(W, group)
    if input.numel() != output.numel() * len(ranks):
        raise ValueError(f"reduce_scatter_tensor: the input has {input.numel()} elements, the "
                         f"output {output.numel()}: the input must be world ({len(ranks)}) "
                         "times the output")

    def combine(ps):
        parts = [p.reshape(-1).chunk(len(ps)) for p in ps]
        return [_reduce(op, [part[i] for part in parts]) for i in range(len(ps))]
    return W.collective("reduce_scatter", ranks, input, _snap(input), combine,
                             copy_into(W, "reduce_scatter_tensor", output), async_op,
                             value=lambda: [output])


all_gather_single = all_gather_into_tensor      # torch 2.14's names for them
reduce_scatter_single = reduce_scatter_tensor


def all_to_all(W, output_tensor_list, input_tensor_list, group=None, async_op=False):
    ranks = _ranks(W, group)

    def deliver(values):
        for out, v in zip(output_tensor_list, values, strict=True):
            out.copy_(v.reshape(out.shape))
    if not len(output_tensor_list) == len(input_tensor_list) == len(ranks):
        raise ValueError(f"all_to_all: {len(input_tensor_list)} input and "
                         f"{len(output_tensor_list)} output tensors for {len(ranks)} ranks")
    flat = torch.cat([t.detach().reshape(-1) for t in input_tensor_list])
    return W.collective("all_to_all", ranks, flat, [_snap(t) for t in input_tensor_list],
                             lambda ps: [[p[i] for p in ps] for i in range(len(ps))], deliver,
                             async_op, value=lambda: list(output_tensor_list))


def all_to_all_single(W, output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    ranks = _ranks(W, group)
    n = len(ranks)
    pieces = list(input.split(input_split_sizes if input_split_sizes else input.shape[0] // n))

    def deliver(values):
        output.copy_(torch.cat(values).reshape(output.shape))
    return W.collective("all_to_all", ranks, input, [_snap(p) for p in pieces],
                             lambda ps: [[p[i] for p in ps] for i in range(n)], deliver, async_op,
                             value=lambda: [output])


def barrier(W, group=None, async_op=False, device_ids=None):
    ranks = _ranks(W, group)
    return W.collective("barrier", ranks, None, None, lambda ps: [None] * len(ps),
                             lambda _: None, async_op)


def send(W, tensor, dst=None, group=None, tag=0, group_dst=None):
    """gloo's blocking send: it returns once the peer received the message."""
    dst = _ranks(W, group)[group_dst] if group_dst is not None else dst
    W.wait_received(W.send(tensor, dst, tag), f"dist.send to rank {dst}")


def isend(W, tensor, dst=None, group=None, tag=0, group_dst=None):
    dst = _ranks(W, group)[group_dst] if group_dst is not None else dst
    m = W.send(tensor, dst, tag, async_op=True)
    W.in_flight.add(W.rank, m, _what(W.rank, m), [("buffer", [tensor])])   # inflight.py
    return _Done(W, m)


def recv(W, tensor, src=None, group=None, tag=0, group_src=None):
    src = _ranks(W, group)[group_src] if group_src is not None else src
    W.recv(src, tag, out=tensor)
    return src


def irecv(W, tensor, src=None, group=None, tag=0, group_src=None):
    src = _ranks(W, group)[group_src] if group_src is not None else src
    world, rank = W, W.rank

    def deliver():
        world.recv(src, tag, out=tensor, posted=True)
    world.post_recv(src, tag)          # posted now: a send to it completes
    m = _Marker(rank, src)
    world.irecvs[rank].append(m)      # its wait is judged when the rank ends (waits.py)
    world.in_flight.add(rank, m, _what(rank, m), [("buffer", [tensor])])
    return Work(world, m, deliver, lambda: [tensor])


class P2POp:
    """dist.P2POp in the simulated world: a point-to-point call (isend or irecv) for
    batch_isend_irecv."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer


def batch_isend_irecv(W, p2p_op_list):
    """Post each P2POp in order; their handles, one per op."""
    calls = {"isend": isend, "irecv": irecv}
    works = []
    for p in p2p_op_list:
        call = calls[getattr(p.op, "__name__", "")]
        peer = "group_dst" if call is isend else "group_src"
        works.append(call(W, p.tensor, p.peer, p.group, p.tag, **{peer: p.group_peer}))
    return works


class _Done:
    """isend's handle: complete once the peer received the message, as on gloo and NCCL
    (`wait()` blocks until then; `is_completed()` says False before, and True records the wait,
    as `wait()` does). It holds only closures: no attribute leads to the world or the message
    a check judges."""

    __slots__ = ("_wait", "_done")

    def __init__(self, world, message):
        def wait():
            if message.waited is None:
                world.wait_received(message, f"an isend's wait() (to rank {message.dst})")
                message.waited = world.event(message.rank, "wait", message)

        def done():
            if message.waited is None and not world.send_received(message):
                return False
            wait()
            return True
        self._wait, self._done = wait, done

    def wait(self, timeout=None):
        self._wait()
        return True

    def is_completed(self):
        return self._done()

    def result(self):
        """gloo's send has none."""
        raise RuntimeError("result() not implemented.")


class _Marker:
    """The Message-like record an irecv's wait() fills in."""

    op = "irecv"

    def __init__(self, rank, src):
        self.rank, self.src, self.waited = rank, src, None


_CALLS = {name: obj for name, obj in dict(globals()).items()
          if callable(obj) and not name.startswith("_") and name not in (
              "torch_distributed", "Group", "P2POp", "contextlib", "stand_in", "threading",
              "torch", "dist", "types", "CheckFailed")}
_CALLS.update({name: getattr(_groups, name) for name in (      # groups.py's
    "new_group", "get_rank", "get_world_size", "get_global_rank", "get_process_group_ranks")})
_CALLS.update(is_initialized=lambda W: True, get_backend=lambda W, group=None: "gloo",
              P2POp=lambda W, *args, **kwargs: P2POp(*args, **kwargs))
_CALLS = types.MappingProxyType(_CALLS)


def _dispatch(name, original, world):
    """torch.distributed's `name` while `world` runs: the world's call from its rank threads,
    torch's own from any other thread. The world is held in this closure only (no module
    global an answer could import)."""
    @stand_in(original) if original is not None else (lambda f: f)
    def call(*args, **kwargs):
        if world.rank is not None:
            outside, out = _outside_answer(name, _CALLS[name], world, args, kwargs)
            if outside:             # torch's answer to a rank outside the group it names
                return out
            out = _CALLS[name](world, *args, **kwargs)
            if type(out) is Work and name != "irecv":     # an async collective (inflight.py)
                _launched(world, _CALLS[name], args, kwargs)
            return out
        if original is None:
            raise RuntimeError(f"torch.distributed.{name} is not available here")
        return original(*args, **kwargs)
    return call


# the functional collectives look their process group up in C++: a thread rank has none (torch
# raises an empty ValueError), so they are not played, and the answer is told which calls are
_FUNCOL = os.path.join(os.path.dirname(dist.__file__), "_functional_collectives")
_PLAYED = ("torch.distributed._functional_collectives needs a real process group, which the "
           "check's thread ranks do not have: the simulated world plays torch.distributed's "
           "own calls (dist.all_reduce, dist.reduce_scatter_tensor, dist.all_gather_into_tensor "
           "and their list forms, dist.all_to_all_single, dist.broadcast, send/recv, "
           "async_op=True) and torch.distributed.nn.functional's, which call them: use one of "
           "those here (functional collectives work on processes)")


def not_simulated(error):
    """A CheckFailed naming the calls the world plays for an error raised inside the functional
    collectives (read from its traceback), else `error` itself."""
    tb = _traceback_of(error)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_FUNCOL):
            return CheckFailed(_PLAYED)
        tb = tb.tb_next
    return error


_COLLECT_ALL = torch._C._collect_all


def _collect_all(futures):
    """torch._C._collect_all while a World runs: the combined future of the World's futures
    records their waits when it is waited on (torch's combines them past their own `wait()`)."""
    collected = _COLLECT_ALL(futures)
    mine = [f for f in futures if isinstance(f, WorkFuture)]
    if not mine:
        return collected
    out = WorkFuture(lambda: waited_all(mine))

    def settle(c):
        try:
            out.set_result(c.value())
        except Exception as e:
            out.set_exception(e)
    collected.add_done_callback(settle)
    return out


@contextlib.contextmanager
def torch_distributed(world):
    """Route torch.distributed's calls from `world`'s rank threads to `world`; and
    torch._C._collect_all, which torch.futures.wait_all and collect_all call however the answer
    bound them, to `_collect_all`, so a wait through them is recorded where the rank waits."""
    if not _ONE.acquire(blocking=False):
        raise RuntimeError("one simulated world at a time")
    saved = {name: getattr(dist, name, None) for name in _CALLS}
    torch._C._collect_all = _collect_all
    for name, original in saved.items():
        setattr(dist, name, _dispatch(name, original, world))
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                if name in vars(dist):
                    delattr(dist, name)
            else:
                setattr(dist, name, original)
        torch._C._collect_all = _COLLECT_ALL
        _ONE.release()
