"""One answer, one behaviour on any device. A device exercise runs the answer twice: on CPU
tensors for the values, on the simulated GPUs (fake.py) for where the work went. An answer that
tells the two runs apart (the device's type, a tensor's class, `torch.cuda.is_available()`, an
attribute only fake tensors have) could compute the values one way and place the work another,
and pass both halves with neither done right. So an answer declared `@check(...,
simulated=True)` has the torch operations of each call traced (their names and the sizes they
were handed), and `FakeGPUs.run` fails it when its run on the simulated GPUs did other work than
its last run on CPU tensors: the same operations, as many times, with the same sizes where the
two runs were handed the same inputs (tensors' shapes, a module's parameters, how many devices;
by name alone where the check drew another case for its simulated run). Moving
between devices (`.to`, `.cuda()`, `.cpu()`) is left out: on CPU tensors it is nothing to do;
so are the questions a simulated tensor answers by a dispatch (its device, sizes, strides), views
(no work; a fake tensor's `.tolist()` unbinds it), copies in place of a view (a reshape copies
by the layout a device's kernel chose) and reading numbers out; attention is one
operation whichever backend each device picks. The comparison is made after the check's own
verdicts (declare.py), so an answer that fails one of them is told that first."""
import collections
import contextlib

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from .composite import split_composite
from .placeholders import READS, read_sizes
from .run import CheckFailed

__all__ = ["traced", "compare_work", "expect_same_work", "check_declared", "values_read"]

_MOVES = frozenset({"_to_copy", "to", "is_pinned", "_pin_memory", "pin_memory", "record_stream",
          "_local_scalar_dense",   # .item(): a fake tensor's .tolist() dispatches, a real one's not
          "clone", "_unsafe_view"})  # a reshape copies or not by the layout a device's kernel chose


class _Trace(TorchDispatchMode):
    """Counts every torch operation below it: (name, the sizes of its tensor arguments)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.whole = 0        # inside an operation counted whole (attention)
        self.read = []        # ((name, sizes), value) of each value read out, in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        parts = split_composite(self, func, args, kwargs or {})
        if parts is not NotImplemented:      # inference mode: its parts were counted
            return parts
        name = func.overloadpacket.__name__
        if not self.whole and name not in _MOVES and func.namespace != "prim" and not _query(name) \
                and not func.is_view:
            self.ops[(name, _sizes((args, kwargs)))] += 1
        out = func(*args, **(kwargs or {}))
        if name in READS:
            self.read.append(((name, read_sizes(args)), out))
        return out


class _Whole(TorchFunctionMode):
    """Attention counted as one operation: each device picks its own kernels for it (a CPU
    flash kernel, the simulated GPUs the math one)."""

    def __init__(self, trace):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.trace.ops[("scaled_dot_product_attention", _sizes(args[:3]))] += 1
        self.trace.whole += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.trace.whole -= 1


def _query(name):
    """Metadata a simulated tensor answers by a dispatch and a real one does not (is_cuda asks
    prim::device; sizes and strides): not work."""
    return name.startswith(("sym_", "is_")) or name in ("dim", "numel", "stride", "size")


def _sizes(value, depth=3):
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if depth and isinstance(value, (list, tuple)):
        return tuple(_sizes(v, depth - 1) for v in value if _has_tensor(v, depth - 1))
    if depth and isinstance(value, dict):
        return tuple(_sizes(v, depth - 1) for v in value.values() if _has_tensor(v, depth - 1))
    return ()


def _inputs(value, depth=4):
    """What the check handed a call, as far as it decides the work's sizes: tensors' shapes, a
    module's parameters and buffers, how many items a list holds (devices), whole numbers.
    Devices themselves are left out: they are what differs between the two runs."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, torch.nn.Module):
        return ("module", tuple((name, tuple(t.shape)) for name, t in
                                (*value.named_parameters(), *value.named_buffers())))
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple, dict)):
        return ()
    if isinstance(value, int):
        return value
    if not depth:
        return len(value)
    items = value.values() if isinstance(value, dict) else value
    return (len(value), tuple(_inputs(v, depth - 1) for v in items))


def _has_tensor(value, depth):
    if isinstance(value, torch.Tensor):
        return True
    if depth and isinstance(value, (list, tuple)):
        return any(_has_tensor(v, depth - 1) for v in value)
    if depth and isinstance(value, dict):
        return any(_has_tensor(v, depth - 1) for v in value.values())
    return False


def _simulated():
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


@contextlib.contextmanager
def traced(answer, args, kwargs):
    """Trace the answer's call; kept on `answer.traces` as "simulated" or "plain"."""
    trace = _Trace()
    where = "simulated" if _simulated() else "plain"
    with _Whole(trace), trace:
        yield
    answer.traces[where] = (_inputs((args, kwargs)), trace.ops)
    if where == "plain":
        answer.traces["read"] = trace.read


def values_read(fn, args, kwargs):
    """The values the answer's last run on CPU tensors read out (((name, sizes), value), in
    order), for its run on the simulated GPUs handed the same inputs to replay; else []."""
    traces = getattr(fn, "traces", None) or {}
    plain = traces.get("plain")
    if plain is None or plain[0] != _inputs((args, kwargs)):
        return []
    return list(traces.get("read", ()))


def compare_work(fn, what):
    """After a run on the simulated GPUs: note on the answer (`fn.traces["differs"]`) how its
    work there differed from its last run on CPU tensors; `expect_same_work` fails it."""
    traces = getattr(fn, "traces", None)
    if not traces or "plain" not in traces or "simulated" not in traces:
        return
    (sizes_plain, plain), (sizes_sim, sim) = traces["plain"], traces.pop("simulated")
    if sizes_plain != sizes_sim:        # other sizes handed: compare the operations' names
        plain = collections.Counter({(name, ()) for name, _ in plain})
        sim = collections.Counter({(name, ()) for name, _ in sim})
    if plain == sim:
        return
    only_cpu = sorted({name for name, _ in plain - sim})
    only_sim = sorted({name for name, _ in sim - plain})
    diff = "; ".join(part for part in (
        f"only on CPU tensors: {', '.join(only_cpu)}" if only_cpu else "",
        f"only on the simulated GPUs: {', '.join(only_sim)}" if only_sim else "",
    ) if part) or "the same operations on other sizes, or as many times"
    traces.setdefault("differs", (
        f"{what}: your code did other work on the simulated GPUs than on CPU tensors ({diff}): "
        "an answer does the same work wherever its tensors are; do not branch on the device's "
        "type or on how the tensors were made"))


def expect_same_work(fn):
    """Once the check's own verdicts passed: fail an answer whose run on the simulated GPUs did
    other work than on CPU tensors."""
    differs = (getattr(fn, "traces", None) or {}).get("differs")
    if differs:
        raise CheckFailed(differs)


def check_declared(fn):
    """A check that runs an answer on the simulated GPUs declares `simulated=True`."""
    if getattr(fn, "traces", False) is None:
        raise RuntimeError("a check that runs the answer on FakeGPUs declares "
                           "@check(..., simulated=True), so its runs are compared")
