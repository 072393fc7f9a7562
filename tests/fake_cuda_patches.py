"""torch.cuda, Tensor's device methods and the few torch functions that reach a device below the
dispatcher, patched as one GPU per rank would answer: the fake GPU's install (tests/fake_cuda.py's
FakeGPU.install; FakeGPU.uninstall undoes it)."""
import time

import torch
import torch.distributed as dist
from fake_cuda import _CPU, index_of, tag, where
from fake_cuda_streams import _REAL_CLOCK, FakeEvent, FakeStream


def install(self):
    """Patch torch for the fake GPU `self` (each patch noted for its uninstall)."""
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
