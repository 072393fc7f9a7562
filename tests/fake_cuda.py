"""Fake GPUs for launch targets: run a rank's code on a CPU as if it ran on `cuda:<rank>` under
NCCL, and report what a real GPU would refuse or mis-measure.

Every tensor stays a real CPU tensor (values, autograd and gloo all work), but a tensor placed on
a GPU carries a tag: Python sees `t.device == cuda:i` and `t.is_cuda`. A dispatch mode watches
every operation and
- refuses what CUDA refuses: an operation mixing a GPU tensor with a CPU one (a 0-dim CPU
  tensor may be an input, as on CUDA), or two GPUs; a CPU tensor in a collective (NCCL
  registers for CUDA only: "No backend type associated with device type cpu");
- notes matrix products computed on the CPU by a rank that has a GPU, and a rank touching
  another rank's GPU;
- keeps track of GPU work queued since the last synchronisation (torch.cuda.synchronize, a
  stream's or event's, .item(), a copy to the CPU, a barrier): a host timer
  (time.perf_counter) read from the course's code while work is queued measures the queueing
  on a real GPU, not the work.
torch.cuda (devices, streams, events, RNG, memory statistics) answers as one GPU per rank would.
With `comm_seconds`, the fake GPU also keeps a timeline, as a GPU under NCCL would: compute
takes no time, but each collective takes that long on a communication stream of its own (one
after another), a work's wait() makes the current stream (not the host) wait for it, an event
fires when its stream gets there, and a synchronisation makes the host wait (it sleeps) for
the streams; a future of a collective completes at once, as NCCL's do at launch.
Only for ranks started by helpers.launch (it leaves marks on torch that it does not undo).
Beside it: fake_cuda_patches.py (torch.cuda and Tensor's methods as installed),
fake_cuda_streams.py, fake_cuda_syncbn.py (SyncBatchNorm's kernels) and fake_cuda_targets.py
(the launch targets).
"""
import contextlib
import os
import sys
import threading
import traceback

import torch
from fake_cuda_streams import _REAL_CLOCK, FakeStream, _sleep_until
from fake_cuda_syncbn import _SYNCBN
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

TAG = "_fake_cuda_index"
_HERE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(_HERE))
# the fake GPU's own files: their frames are not the code that asked for an operation
_OURS = {os.path.join(os.path.dirname(_HERE), f"fake_cuda{part}.py")
         for part in ("", "_patches", "_streams", "_syncbn", "_targets")}
_COURSE = tuple(os.path.join(_ROOT, d) + os.sep for d in ("helpers", "scripts"))
_TORCH = os.path.dirname(torch.__file__) + os.sep
_CPU = torch.device("cpu")
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "convolution", "_convolution",
            "cudnn_convolution", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
# operations that move data between devices (or bind storage), allowed to mix them
_MOVES = {"copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize", "set_",
          "lift_fresh", "lift_fresh_copy", "index", "index_put_", "index_put", "_index_put_impl_"}
_SYNCING = {"_local_scalar_dense", "equal", "is_nonzero", "allclose", "_assert_async"}


def index_of(t):
    """The fake GPU a tensor lives on, or None (the CPU)."""
    try:
        i = t.__dict__.get(TAG)
    except AttributeError:
        return None
    if i is None and hasattr(t, "_local_tensor"):     # a DTensor: its local shard's
        return index_of(t._local_tensor)
    return i


def tag(t, i):
    if isinstance(t, torch.Tensor):
        if i is None:
            t.__dict__.pop(TAG, None)
        else:
            t.__dict__[TAG] = i


def where(frame=None):
    """file:line (function) of the innermost frame of the course's code (helpers/, scripts/);
    a clock helper's frames are skipped (its reading belongs to the code that asked for it),
    and so are the wrappers of torch.distributed (DistComm, count_traffic)."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.endswith(_CLOCK_HELPERS):
            pass
        elif path.startswith(_COURSE) or (frame.f_code.co_name == "canary" and
                                          os.path.abspath(path) in _OURS):
            return f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


_CLOCK_HELPERS = (os.path.join("helpers", "runtime", "emulate.py"),
                  os.path.join("helpers", "devices.py"),
                  # and the wrappers around torch.distributed: a collective's tensors are
                  # the caller's
                  os.path.join("helpers", "runtime", "comm.py"),
                  os.path.join("helpers", "runtime", "traffic.py"))


def where_raised(tb):
    """where() of the innermost course frame of a traceback."""
    at = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_COURSE):
            f = tb.tb_frame
            at = f"{os.path.relpath(f.f_code.co_filename, _ROOT)}:{tb.tb_lineno} " \
                 f"({f.f_code.co_name})"
        tb = tb.tb_next
    return at


def _innermost():
    """The innermost Python frame outside the fake GPU's files (_OURS) and torch's dispatch
    machinery: who asked for the operation (None when only C++ did)."""
    frame = sys._getframe(2)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename) in _OURS or
                                 frame.f_code.co_filename.endswith(_PLUMBING) or
                                 frame.f_code.co_name == "__torch_dispatch__"):
        frame = frame.f_back             # (another mode's dispatch, e.g. PeakBytes': plumbing)
    return frame


def _from(frame, path_part):
    return frame is not None and frame.f_code.co_filename.endswith(path_part)


def _object_collective(frame):
    """True inside all_gather_object and its kind: torch picks their tensors' device from the
    backend (NCCL: the current GPU), whatever the caller holds."""
    while frame is not None:
        if frame.f_code.co_name in _OBJECT_COLLECTIVES and \
                frame.f_code.co_filename.endswith("distributed_c10d.py"):
            return True
        frame = frame.f_back
    return False


_DDP = os.path.join("nn", "parallel", "distributed.py")
_OBJECT_COLLECTIVES = {"all_gather_object", "gather_object", "broadcast_object_list",
                       "scatter_object_list", "send_object_list", "recv_object_list"}
_PLUMBING = (os.path.join("utils", "_python_dispatch.py"), "_ops.py", "_compile.py",
             os.path.join("_dynamo", "eval_frame.py"), "c10d_logger.py", "contextlib.py")


class NotOnItsGPU(RuntimeError):
    """What a real GPU would have raised (the message says which rule, and where)."""


class FakeGPU:
    """The fake GPU of one rank: cuda:`index` of `count`. `problems`: (kind, where, what)."""

    def __init__(self, index, count, comm_seconds=0.0, comm_ops=None):
        self.index, self.count = index, count
        self.comm_ops = comm_ops      # the collectives that take comm_seconds (None: every one)
        self.pending = False          # GPU work queued since the last synchronisation
        self.problems = []
        self._seen = set()
        self._saved = []
        self.comm_seconds = comm_seconds
        self.comm_ready = 0.0         # when the communication stream has run what it was given
        self.streams = []
        self.default = FakeStream(self)
        self._current = threading.local()

    # ---- the simulated timeline (comm_seconds) -------------------------------------------------
    def current_stream(self):
        return getattr(self._current, "stream", None) or self.default

    @contextlib.contextmanager
    def use_stream(self, stream):
        old = getattr(self._current, "stream", None)
        self._current.stream = stream if stream is not None else old
        try:
            yield stream
        finally:
            self._current.stream = old

    def wait_for_streams(self):
        """The host waits until every stream (and the communication) has run its work."""
        _sleep_until(max([self.comm_ready] + [s.ready for s in self.streams]))
        self.synced()

    # ---- what the checks found -----------------------------------------------------------------
    def note(self, kind, what, at=None):
        at = at or where()
        if (kind, at) not in self._seen:
            self._seen.add((kind, at))
            self.problems.append((kind, at, what))

    def refuse(self, kind, what):
        at = where()
        if os.environ.get("FAKE_CUDA_TRACEBACK"):
            what += "\n" + "".join(traceback.format_stack()[-14:-2])
        self.note(kind, what, at)
        raise NotOnItsGPU(f"{kind} at {at}: {what}")

    def synced(self):
        self.pending = False

    # ---- the dispatch mode -----------------------------------------------------------------------
    def dispatch(self, func, types, args, kwargs):
        kwargs = dict(kwargs or {})
        name = func._schema.name.split("::")[-1]
        ns = func.namespace
        target = None                                      # a device asked for
        if "device" in kwargs and kwargs["device"] is not None:
            dev = torch.device(kwargs["device"])
            if dev.type == "cuda":
                target = self.index if dev.index is None else dev.index
                kwargs["device"] = _CPU
            else:
                target = "cpu"
        kwargs.pop("pin_memory", None)
        if name == "is_pinned":
            return False
        if name in ("_pin_memory", "record_stream"):
            return args[0] if name == "_pin_memory" else None
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        gpus = {index_of(t) for t in tensors} - {None}
        if gpus - {self.index}:
            self.note("another rank's GPU", f"{name} touches cuda:{sorted(gpus - {self.index})}"
                      f" from the rank on cuda:{self.index}")
        if ns in ("c10d", "_c10d_functional", "c10d_functional"):
            return self._collective(func, name, args, kwargs, tensors)
        written = self._written(func, args, kwargs)
        caller = _innermost()
        engine = _from(caller, os.path.join("autograd", "graph.py"))   # C++ autograd, DDP's
        if gpus and name not in _MOVES and not engine:                  # reducer: unchecked
            cpu = [t for t in tensors if index_of(t) is None
                   and (t.dim() > 0 or any(t is w for w in written)) and not t.is_meta]
            if cpu or len(gpus) > 1:
                places = sorted(f"cuda:{i}" for i in gpus) + (["cpu"] if cpu else [])
                self.refuse("mixes devices", f"{name} on {' and '.join(places)}: Expected all "
                            "tensors to be on the same device" + (
                                f" (CPU: {[tuple(t.shape) for t in cpu]})"
                                if os.environ.get("FAKE_CUDA_TRACEBACK") else ""))
        if not tensors and target in (None, "cpu") and (engine or _from(caller, _DDP)):
            target = self.index        # made by C++ from a GPU tensor's options (autograd's
            #                            formulas, DDP's buckets): on the rank's GPU
        if not gpus and target in (None, "cpu") and name in _MATMULS and \
                not any(t.is_meta for t in tensors):
            self.note("computes on the CPU", f"{name} of CPU tensors by the rank that has "
                      f"cuda:{self.index}")
        out = _SYNCBN[name](*args, **kwargs) if name in _SYNCBN and gpus else \
            func(*args, **kwargs)
        if name in ("_to_copy", "to"):
            src = index_of(args[0])
            i = src if target is None else (None if target == "cpu" else target)
            if src is not None and i is None and not kwargs.get("non_blocking"):
                self.synced()                              # a copy to the CPU waits for the GPU
            self._tag_new(out, args, i)
        elif name == "copy_":
            if index_of(args[0]) is None and index_of(args[1]) is not None \
                    and not kwargs.get("non_blocking"):
                self.synced()
        elif name == "set_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            tag(args[0], index_of(args[1]))
        else:
            i = (None if target == "cpu" else target) if target is not None else \
                (min(gpus) if gpus else None)
            if engine:                 # C++ autograd and DDP's reducer compute gradients on
                i = self.index         # the parameters' device (tensors they make lose tags)
            self._tag_new(out, args, i)
        if gpus or (target not in (None, "cpu")):
            self.pending = True
            if name in _SYNCING:
                self.synced()
        return out

    def _written(self, func, args, kwargs):
        schema = func._schema
        out = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                out += [t for t in tree_leaves(v) if isinstance(t, torch.Tensor)]
        return out

    def _tag_new(self, out, args, i):
        inputs = {id(t) for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in inputs:
                tag(t, i)

    def _collective(self, func, name, args, kwargs, tensors):
        if name == "barrier":                               # NCCL's barrier blocks the host
            out = func(*args, **kwargs)
            self.synced()
            return out
        caller = _innermost()
        if _from(caller, "distributed_c10d.py") and not _object_collective(caller):
            cpu = [t for t in tensors if index_of(t) is None and not t.is_meta]
            if cpu:
                self.refuse("a CPU tensor in an NCCL collective",
                            f"{name} of a {list(cpu[0].shape)} CPU tensor: No backend type "
                            "associated with device type cpu")
        out = func(*args, **kwargs)
        gpus = {index_of(t) for t in tensors} - {None}
        self._tag_new(out, args, min(gpus) if gpus else None)
        if gpus:
            self.pending = True
            if self.comm_seconds and (self.comm_ops is None or name in self.comm_ops):
                # queued behind the communication already queued
                self.comm_ready = max(_REAL_CLOCK(), self.comm_ready) + self.comm_seconds
        return out

    # ---- torch.cuda as one GPU per rank would answer -----------------------------------------
    def install(self):
        """Patch torch as this GPU would answer (tests/fake_cuda_patches.py)."""
        from fake_cuda_patches import install
        install(self)

    def _set_device(self, device):
        i = device if isinstance(device, int) else torch.device(device).index
        if i is not None and i != self.index:
            self.note("another rank's GPU", f"set_device({i}) on the rank of cuda:{self.index}")

    def _all_rng(self):
        self.note("another rank's GPU", f"get_rng_state_all() reads all {self.count} GPUs' "
                  "generators (each rank creates a context on every GPU)")
        return [torch.get_rng_state()] * self.count

    def _patch(self, owner, name, value):
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def uninstall(self):
        for owner, name, old in reversed(self._saved):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved = []

    @contextlib.contextmanager
    def active(self):
        self.install()
        try:
            with _Mode(self):
                yield self
        finally:
            self.uninstall()


_MISSING = object()


class _Mode(TorchDispatchMode):
    def __init__(self, gpu):
        super().__init__()
        self.gpu = gpu

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        plain = (torch.Tensor, torch.nn.Parameter)
        if any(t not in plain for t in types):
            from torch._subclasses.fake_tensor import FakeTensor
            if all(issubclass(t, FakeTensor) or t in plain for t in types):
                return func(*args, **(kwargs or {}))    # torch's own shape propagation
            return NotImplemented                       # DTensor: its local ops come back here
        return self.gpu.dispatch(func, types, args, kwargs)
