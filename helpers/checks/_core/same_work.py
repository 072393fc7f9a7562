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
operation whichever backend each device picks. The values the CPU run reads out are kept, in
order, for the simulated run to replay (placeholders.py): those read by an operation
(`_local_scalar_dense`: `int(t)`, `.item()`, iteration) and those read past the dispatcher
(`.tolist()`, `.numpy()`, `np.asarray`: exits.py's watch), one per element, as the simulated
tensors' `.tolist()` reads them. The comparison is made after the check's own verdicts
(declare.py), so an answer that fails one of them is told that first; a difference after the
simulated run read placeholders (values it could not replay) is the grader's limit."""
import collections
import contextlib
import threading

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from .composite import split_composite
from .exits import watch_exits
from .placeholders import READS, read_sizes
from .run import CheckFailed, HarnessError

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
        self.lock = threading.Lock()   # the answer's threads count one operation at a time

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        parts = split_composite(self, func, args, kwargs or {})
        if parts is not NotImplemented:      # inference mode: its parts were counted
            return parts
        name = func.overloadpacket.__name__
        if not self.whole and name not in _MOVES and func.namespace != "prim" and not _query(name) \
                and not func.is_view:
            with self.lock:
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
        with self.trace.lock:
            self.trace.ops[("scaled_dot_product_attention", _sizes(args[:3]))] += 1
        self.trace.whole += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.trace.whole -= 1


# the exits that hand the values themselves to Python (exits.py's words for them); read again here
# with the C method under no function mode (no stand-in, no mode of the reader's runs)
_READ_OUT = frozenset({".tolist()", ".numpy()", "np.asarray()"})
_TOLIST = torch._C.TensorBase.tolist
_ONE = ("_local_scalar_dense", ((),))   # how a simulated tensor's .tolist() reads each element


def _reads_out(trace):
    """An exit watcher: each value a `.tolist()`, `.numpy()` or `np.asarray` of a tensor hands
    out in a thread `trace` watches, appended to its reads as one read of a 0-d tensor each (a
    subclass's, by exact type, reads through the dispatcher if at all: `trace` sees those)."""
    def note(t, how):
        kind = type(t)          # compared by identity: no `__eq__` of the reader's runs
        if how not in _READ_OUT or not (kind is torch.Tensor or kind is torch.nn.Parameter) or \
                not any(mode is trace for mode in _get_current_dispatch_mode_stack()):
            return
        try:
            with torch._C.DisableTorchFunction():
                values = _TOLIST(t)
        except Exception:       # no values to hand (a meta tensor): the exit itself raises
            return
        trace.read.extend((_ONE, v) for v in _flat(values))
    return note


def _flat(values):
    if not isinstance(values, list):
        return [values]
    return [v for item in values for v in _flat(item)]


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
    reads = watch_exits(_reads_out(trace)) if where == "plain" else contextlib.nullcontext()
    with _Whole(trace), trace, reads:
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


def compare_work(fn, what, answered=0):
    """After a run on the simulated GPUs: note on the answer (`fn.traces["differs"]`) how its
    work there differed from its last run on CPU tensors; `expect_same_work` fails it, or, when
    that run read `answered` placeholders, reports the grader's limit."""
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
    if not answered:        # every value it read was the CPU run's: the answer's difference
        if traces.get("differs", (None,))[0] is not CheckFailed:   # (over a grader's limit)
            traces["differs"] = (CheckFailed,
                f"{what}: your code did other work on the simulated GPUs than on CPU tensors "
                f"({diff}): an answer does the same work wherever its tensors are; do not branch "
                "on the device's type or on how the tensors were made")
        return
    traces.setdefault("differs", (HarnessError,    # its work followed values it could not know
        f"{what}: your code did other work on the simulated GPUs than on CPU tensors ({diff}) "
        f"after reading {answered} value(s) out of tensors that they could not replay from "
        "your run on CPU tensors and answered with placeholders (0, False; True for all() and "
        "allclose). That work followed values the simulated GPUs do not hold: this is the "
        "grader's limit, not a verdict on your answer, whose values are judged on CPU tensors. "
        "Decide the work from shapes rather than from values read out of tensors, and run the "
        "check again"))


def expect_same_work(fn):
    """Once the check's own verdicts passed: fail an answer whose run on the simulated GPUs did
    other work than on CPU tensors (the grader's limit where that run read placeholders)."""
    differs = (getattr(fn, "traces", None) or {}).get("differs")
    if differs:
        raise differs[0](differs[1])


def check_declared(fn):
    """A check that runs an answer on the simulated GPUs declares `simulated=True`."""
    if getattr(fn, "traces", False) is None:
        raise RuntimeError("a check that runs the answer on FakeGPUs declares "
                           "@check(..., simulated=True), so its runs are compared")
