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
"""
import contextlib
import dataclasses
import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

TAG = "_fake_cuda_index"
_REAL_CLOCK = time.perf_counter
_HERE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(_HERE))
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
                                          os.path.abspath(path) == _HERE):
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
    """The innermost Python frame outside this file and torch's dispatch machinery: who asked
    for the operation (None when only C++ did)."""
    frame = sys._getframe(2)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename) == _HERE or
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
        gpu = self
        T = torch.Tensor
        base_device = torch._C.TensorBase.device
        base_is_cuda = torch._C.TensorBase.is_cuda
        base_data = torch._C.TensorBase.data
        base_tolist, base_numpy, base_get_device = T.tolist, T.numpy, T.get_device
        base_wrapper = torch._C.TensorBase._make_wrapper_subclass
        base_param_new = torch.nn.Parameter.__new__

        def device(self):
            i = index_of(self)
            return torch.device("cuda", i) if i is not None else base_device.__get__(self)

        def get_data(self):
            d = base_data.__get__(self)
            tag(d, index_of(self))
            return d

        def set_data(self, value):
            base_data.__set__(self, value)
            tag(self, index_of(value))

        def tolist(self):
            if index_of(self) is not None:
                gpu.synced()
            return base_tolist(self)

        def numpy(self, *a, **k):
            if index_of(self) is not None:
                raise TypeError("can't convert cuda tensor to numpy. Use Tensor.cpu() to copy "
                                "the tensor to host memory first.")
            return base_numpy(self, *a, **k)

        def wrapper(cls, *args, **kwargs):
            dev = kwargs.get("device")
            i = None
            if dev is not None and torch.device(dev).type == "cuda":
                i, kwargs["device"] = torch.device(dev).index, _CPU
            out = base_wrapper(cls, *args, **kwargs)
            tag(out, i)
            return out

        def param_new(cls, data=None, requires_grad=True):
            p = base_param_new(cls, data, requires_grad)
            if data is not None:
                tag(p, index_of(data))
            return p

        self._patch(T, "device", property(device))
        self._patch(T, "is_cuda", property(lambda s: index_of(s) is not None
                                           or base_is_cuda.__get__(s)))
        self._patch(T, "data", property(get_data, set_data))
        self._patch(T, "tolist", tolist)
        base_to = T.to

        def to(self, *args, **kwargs):
            copy = kwargs.pop("copy", False)
            dev, dtype, non_blocking, fmt = torch._C._nn._parse_to(*args, **kwargs)
            if dev is not None and dev.type == "cuda" and dev.index is None:
                dev = torch.device("cuda", gpu.index)      # "cuda": the current device
            if dev is not None and dev.type == "cpu" and index_of(self) is not None:
                if not non_blocking:                       # torch would hand back self
                    gpu.synced()
                copy = True
            if isinstance(args[0] if args else None, torch.Tensor):
                return base_to(self, *args, copy=copy, **kwargs)   # to(other): its device
            return base_to(self, **{k: v for k, v in dict(
                device=dev, dtype=dtype, non_blocking=non_blocking, copy=copy,
                memory_format=fmt).items() if v is not None})
        self._patch(T, "to", to)
        self._patch(T, "cpu", lambda s, memory_format=torch.preserve_format:
                    to(s, "cpu", memory_format=memory_format))
        self._patch(T, "numpy", numpy)
        self._patch(T, "get_device", lambda s: index_of(s) if index_of(s) is not None
                    else base_get_device(s))
        self._patch(T, "_make_wrapper_subclass", staticmethod(wrapper))
        self._patch(torch.nn.Parameter, "__new__", param_new)
        for name in ("tensor", "as_tensor"):      # they move to the device below the dispatcher
            self._patch(torch, name, _made_then_moved(getattr(torch, name)))
        self._patch(T, "new_tensor", _made_then_moved(T.new_tensor, method=True))
        self._patch(torch.nn.functional, "one_hot",
                    _on_its_device(torch.nn.functional.one_hot))

        cuda = torch.cuda

        def current_stream(device=None):
            return gpu.current_stream()

        def work_wait(work, *args, **kwargs):      # NCCL: the current stream waits, not the host
            out = base_work_wait(work, *args, **kwargs)
            stream = gpu.current_stream()
            stream.ready = max(stream.ready, gpu.comm_ready)
            return out
        base_work_wait = dist.Work.wait
        self._patch(dist.Work, "wait", work_wait)

        # A profiler on a GPU must ask for CUDA activity (else its trace lacks the kernels). That
        # activity has no kernels to record here, and on a machine without CUDA it made every
        # profiled op cost milliseconds (the sweep's two traced targets: 270 s of CPU), so the
        # fake GPU checks the request, then profiles the CPU only.
        base_profile_init = torch.profiler.profile.__init__
        cuda_activity = torch.profiler.ProfilerActivity.CUDA
        no_real_gpu = not (torch.backends.cuda.is_built() and torch._C._cuda_getDeviceCount() > 0)

        def profile_init(prof, *args, activities=None, **kwargs):
            if activities is not None and cuda_activity not in activities:
                gpu.note("profiles a GPU without its kernels", "torch.profiler without "
                         "ProfilerActivity.CUDA: the trace holds the host's launches only")
            elif no_real_gpu:    # None: torch's default, CUDA too where it seems available
                activities = [a for a in activities or torch.profiler.supported_activities()
                              if a != cuda_activity]
            return base_profile_init(prof, *args, activities=activities, **kwargs)
        self._patch(torch.profiler.profile, "__init__", profile_init)

        for name, value in dict(
                _lazy_init=lambda: None, is_available=lambda: True,
                is_initialized=lambda: True, device_count=lambda: self.count,
                current_device=lambda: self.index, set_device=self._set_device,
                synchronize=lambda device=None: self.wait_for_streams(),
                Stream=lambda *a, **k: FakeStream(gpu), Event=lambda *a, **k: FakeEvent(gpu),
                current_stream=current_stream, default_stream=lambda device=None: gpu.default,
                stream=self.use_stream,
                get_rng_state=lambda device="cuda": torch.get_rng_state(),
                set_rng_state=lambda state, device="cuda": None,
                get_rng_state_all=self._all_rng, set_rng_state_all=lambda states: None,
                manual_seed=lambda seed: None, manual_seed_all=lambda seed: None,
                seed=lambda: None, reset_peak_memory_stats=lambda device=None: None,
                max_memory_allocated=lambda device=None: 0,
                memory_allocated=lambda device=None: 0, memory_reserved=lambda device=None: 0,
                max_memory_reserved=lambda device=None: 0, empty_cache=lambda: None,
                get_device_name=lambda device=None: "fake GPU",
                get_device_capability=lambda device=None: (9, 0),
                is_current_stream_capturing=lambda: False,
                is_bf16_supported=lambda *a, **k: True).items():
            self._patch(cuda, name, value)
        acc = getattr(torch, "accelerator", None)
        if acc is not None:
            for name, value in dict(
                    current_accelerator=lambda *a, **k: torch.device("cuda"),
                    is_available=lambda: True, device_count=lambda: self.count,
                    current_device_index=lambda: self.index,
                    current_device_idx=lambda: self.index,
                    set_device_index=self._set_device, set_device_idx=self._set_device,
                    synchronize=lambda device=None: self.wait_for_streams(),
                    current_stream=current_stream).items():
                if hasattr(acc, name):
                    self._patch(acc, name, value)
        self._patch(dist, "get_backend", lambda group=None: "nccl")
        import torch.nn.parallel.distributed as ddp_module
        base_verify = ddp_module._verify_param_shape_across_processes

        def verify(process_group, tensors, logger=None):
            """DDP's constructor checks and broadcasts the parameters below the dispatcher
            (where no mode sees them): on NCCL they must be on the GPU already."""
            cpu = [t for t in tensors if index_of(t) is None and not t.is_meta]
            if cpu:
                gpu.refuse("a CPU tensor in an NCCL collective", f"DDP's constructor "
                           f"broadcasts {len(cpu)} CPU parameter(s): No backend type "
                           "associated with device type cpu (move the model to its GPU first)")
            return base_verify(process_group, tensors, logger)
        self._patch(ddp_module, "_verify_param_shape_across_processes", verify)

        def clock():
            if gpu.pending:
                at = where()
                if at != "?":
                    gpu.note("a timer that does not synchronise",
                             "time.perf_counter() read while GPU work is queued: it measures "
                             "the queueing (synchronise first: helpers.synced_now(device))", at)
            return _REAL_CLOCK()
        self._patch(time, "perf_counter", clock)

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


# nn.SyncBatchNorm's kernels exist for CUDA only: the same arithmetic on the CPU
def _bn_shape(x):
    return [0] + list(range(2, x.dim())), [1, -1] + [1] * (x.dim() - 2)


def _bn_stats(x, eps):
    dims, _ = _bn_shape(x)
    return x.mean(dims), (x.var(dims, unbiased=False) + eps).rsqrt()


def _bn_gather(x, mean, invstd, running_mean, running_var, momentum, eps, counts):
    c = counts.to(mean.dtype).reshape(-1, 1)
    n = c.sum()
    gmean = (mean * c).sum(0) / n
    gvar = ((invstd.pow(-2) - eps + (mean - gmean).pow(2)) * c).sum(0) / n
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(gmean.to(running_mean.dtype) * momentum)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(
                (gvar * n / (n - 1)).to(running_var.dtype) * momentum)
    return gmean, (gvar + eps).rsqrt()


def _bn_elemt(x, weight, bias, mean, invstd, eps=None):
    _, shape = _bn_shape(x)
    y = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        y = y * weight.reshape(shape)
    return y + bias.reshape(shape) if bias is not None else y


def _bn_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    dims, shape = _bn_shape(x)
    sum_dy, sum_dy_xmu = dy.sum(dims), (dy * (x - mean.reshape(shape))).sum(dims)
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def _bn_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    _, shape = _bn_shape(x)
    n = count.sum().to(dy.dtype)
    k = invstd.pow(2) * sum_dy_xmu / n
    scale = invstd * (weight if weight is not None else 1.0)
    return (dy - (sum_dy / n).reshape(shape) - (x - mean.reshape(shape)) * k.reshape(shape)) \
        * scale.reshape(shape)


_SYNCBN = {"batch_norm_stats": _bn_stats, "batch_norm_gather_stats_with_counts": _bn_gather,
           "batch_norm_elemt": _bn_elemt, "batch_norm_backward_reduce": _bn_backward_reduce,
           "batch_norm_backward_elemt": _bn_backward_elemt}


def _made_then_moved(make, method=False):
    """torch.tensor(data, device=cuda) copies to the device below the dispatcher (where no mode
    sees it): make it on the CPU, then move it (dispatched)."""
    def made(*args, device=None, **kwargs):
        if device is None or torch.device(device).type != "cuda":
            return make(*args, device=device, **kwargs)
        if method:
            return make(*args, device=_CPU, **kwargs).to(device)
        return make(*args, **kwargs).to(device)
    return made


def _on_its_device(op):
    """A composite op that builds its output from its input's options below the dispatcher
    (F.one_hot's zeros): a real GPU puts it there; here run it on the CPU and move the result
    to where the input lives (dispatched)."""
    def run(t, *args, **kwargs):
        if index_of(t) is None:
            return op(t, *args, **kwargs)
        return op(t.cpu(), *args, **kwargs).to(t.device)
    return run


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


def _sleep_until(t):
    while _REAL_CLOCK() < t:
        time.sleep(t - _REAL_CLOCK())


class FakeStream:
    def __init__(self, gpu):
        self.gpu = gpu
        self.ready = 0.0       # when it has run what it was given (comm_seconds: its waits)
        gpu.streams.append(self)

    def synchronize(self):
        _sleep_until(self.ready)
        self.gpu.synced()

    def wait_stream(self, other):
        self.ready = max(self.ready, other.ready)

    def wait_event(self, event):
        self.ready = max(self.ready, event.t or 0.0)

    def record_event(self, event=None):
        event = event or FakeEvent(self.gpu)
        event.record(self)
        return event

    def query(self):
        return not self.gpu.pending

    def is_capturing(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.t, self.done = gpu, None, False

    def record(self, stream=None):
        """It fires when its stream gets there: now, or once what the stream waits for ran."""
        stream = stream or self.gpu.current_stream()
        self.t, self.done = max(_REAL_CLOCK(), stream.ready), not self.gpu.pending

    def synchronize(self):
        _sleep_until(self.t or 0.0)
        self.gpu.synced()
        self.done = True

    def wait(self, stream=None):
        pass

    def query(self):
        return self.done or not self.gpu.pending

    def elapsed_time(self, end):
        if not (end.done or not self.gpu.pending):
            self.gpu.note("a timer that does not synchronise", "Event.elapsed_time() before "
                          "the end event completed (end.synchronize() first)")
        return (end.t - self.t) * 1e3


# ---- a launch target that runs another on the fake GPUs -----------------------------------------
def on_fake_gpus(rank, world, cfg):
    """Launch target: each of cfg["runs"] [(label, fn, kwargs)] on this rank's fake GPU
    (cuda:rank, NCCL rules), in turn. Returns {label: dict(problems, error, result_on_gpu,
    seconds)}. A rank that fails leaves the process group at once (a peer waiting in a
    collective then fails too, instead of hanging) and every rank joins a fresh group before
    the next target."""
    import datetime
    store = dist.distributed_c10d._get_default_store()
    timeout = datetime.timedelta(seconds=cfg.get("timeout", 30))
    report = {}
    for k, (label, fn, kwargs) in enumerate(cfg["runs"]):
        gpu = FakeGPU(rank, world)
        error, on_gpu, t0 = None, [], _REAL_CLOCK()
        try:
            with gpu.active():
                got = fn(rank, world, dict(kwargs, device=torch.device("cuda", rank)))
                on_gpu = sorted({str(tuple(t.shape)) for t in tree_leaves(_opened(got))
                                 if isinstance(t, torch.Tensor) and index_of(t) is not None})
        except (Exception, BaseException) as e:   # reported per target
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            if not isinstance(e, NotOnItsGPU):
                gpu.note("crashed", error + ("\n" + traceback.format_exc()[-3000:]
                                             if os.environ.get("FAKE_CUDA_TRACEBACK") else ""),
                         where_raised(e.__traceback__))
            if os.environ.get("FAKE_CUDA_TRACEBACK"):
                error += "\n" + "".join(traceback.format_exc().splitlines(True)[-12:])
            dist.destroy_process_group()
        report[label] = dict(problems=gpu.problems, error=error, result_on_gpu=on_gpu,
                             seconds=_REAL_CLOCK() - t0)
        store.set(f"fake/{k}/{rank}", "fail" if error else "ok")
        states = [store.get(f"fake/{k}/{r}").decode() for r in range(world)]
        if "fail" in states:
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("gloo", store=dist.PrefixStore(f"fake/{k}/group", store),
                                    rank=rank, world_size=world, timeout=timeout)
    return report


def _opened(obj):
    """obj with every dataclass (a launch target's result) as a dict of its fields, so that
    tree_leaves finds the tensors inside."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _opened(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _opened(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_opened(v) for v in obj]
    return obj


def describe(problems):
    """Problems [(kind, where, what)] as lines for an assertion message."""
    return [f"{kind} at {at}: {what}" for kind, at, what in problems]


# ---- canaries: launch targets that make one mistake each, on purpose ----------------------------
CANARIES = {"cpu_collective": "a CPU tensor in an NCCL collective",
            "cpu_model": "mixes devices", "cpu_compute": "computes on the CPU",
            "timer": "a timer that does not synchronise",
            "cpu_profiler": "profiles a GPU without its kernels", "none": None}


def canary(rank, world, cfg):
    """Launch target: a small step done right (bug="none") or with one mistake (cfg["bug"])."""
    device, bug = cfg["device"], cfg["bug"]
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    if bug != "cpu_model":
        net = net.to(device)
    X = torch.randn(16, 8, device=None if bug == "cpu_compute" else device)
    if bug == "cpu_compute":
        net = net.cpu()
    from helpers.devices import synced_now
    start = time.perf_counter() if bug == "timer" else synced_now(device)
    loss = net(X).square().mean()
    loss.backward()
    flag = torch.ones(1, device=None if bug == "cpu_collective" else device)
    dist.all_reduce(flag)
    if bug == "cpu_profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            net(X).sum()
    seconds = (time.perf_counter() if bug == "timer" else synced_now(device)) - start
    return dict(loss=float(loss), seconds=seconds, weight=net.weight.detach().cpu())


# ---- a fake GPU whose all-reduces take time: what a host clock would miss ------------------------
def slow_comm(rank, world, cfg):
    """Launch target: each of cfg["runs"] [(label, fn, kwargs)] on this rank's fake GPU, whose
    collectives (those named in cfg["comm_ops"] if given) take cfg["comm"] seconds each on the
    GPU (a dict: {label: seconds}) while their futures complete at once (as NCCL's do at
    launch). Returns {label: dict(result, problems)}."""
    out = {}
    for label, fn, kwargs in cfg["runs"]:
        comm = cfg["comm"]
        gpu = FakeGPU(rank, world, comm_ops=cfg.get("comm_ops"),
                      comm_seconds=comm[label] if isinstance(comm, dict) else comm)
        with gpu.active():
            got = fn(rank, world, dict(kwargs, device=torch.device("cuda", rank)))
        out[label] = dict(result=got, problems=gpu.problems)
    return out
