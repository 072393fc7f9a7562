"""Simulated GPUs for placement: `FakeGPUs(k)` gives tensors on cuda:0 … cuda:k-1 on any
machine, CPU-only included.

torch's FakeTensorMode keeps shapes, dtypes and devices but no values: an operation on a tensor
of cuda:1 runs "on cuda:1", `.to("cuda:0")` moves it, and an operation that mixes two devices
raises, as it would on real GPUs. So a device exercise runs twice: on CPU tensors for the values,
and here for where each tensor went and what crossed between devices (a Recorder is active).
Values are unknown here: `.item()` and `torch.equal` get placeholders, so the answer's returned
value means nothing; only what it did counts. A simulated CPU tensor's `.numpy()` and
`np.asarray` read its elements like its `.tolist()` (one `_local_scalar_dense` each, answered by
the CPU run's values where they replay); a simulated GPU tensor's raise TypeError, as a real
one's. The kernels that hand elements to a Python
callback (`apply_`, `map_`, `map2_`) would read memory a fake tensor lacks and crash the
interpreter: on a fake tensor they fail the answer instead (exits.py watches them). `t.data =
new` does what it does on real devices: `t` takes `new`'s storage and device (a fake tensor
would keep the device it was made on, and a real one given a fake's data would read "meta").

The simulation never touches a real GPU, so it runs the same on a machine with fewer GPUs than
it simulates (one H200 simulating cuda:0..4): torch's FakeTensorMode, where CUDA is available,
creates a real tensor on every device a fake tensor names (`init_gpu_context`: "invalid device
ordinal" for cuda:1 on one GPU) and materialises `torch.tensor(..., device=...)` there; here it
behaves as on a machine without CUDA. One call stays out of reach: where CUDA is available,
autograd asks the real runtime for the stream of each device a tensor needing gradients is on,
so a simulation with gradients on a device this machine lacks fails; that error is reported as
the check's limit (HarnessError), never as the answer's mistake. torch.cuda's device, stream and
event calls stand in while the answer runs (cuda_calls.py); one that does not, and reaches the
real runtime, is named in the HarnessError. The streams order the work: a read of what another
stream wrote, with no wait between them, fails the answer (stream_races.py).
"""
import contextlib
import threading
import types

import numpy as np
import torch
import torch.utils
from torch._subclasses import fake_tensor

from .carried import CarriedFunctionMode, one_simulated_op
from .cuda_calls import not_stood_in, simulated_cuda
from .cuda_streams import Waits
from .exits import CALLBACKS, watch_exits
from .observe import describe_device
from .reader_objects import is_a
from .run import CheckFailed, HarnessError
from .same_work import check_declared, compare_work, values_read
from .stream_races import Races, handed, stream_recorder

__all__ = ["FakeGPUs"]


_PIN = torch.ops.aten._pin_memory.default


def _fake_tensor_module():
    return fake_tensor


def _simulated_mode():
    """A FakeTensorMode that keeps off the real devices, as where CUDA is unavailable, and that
    threads share: each operation whole (one_simulated_op), "inside a kernel" per thread (torch
    keeps that flag on the mode, beside a per-thread dispatch key: a tensor read `.device` as
    "meta" while another thread ran a kernel, and two kernels at once tripped its assertion)."""
    ft = _fake_tensor_module()
    broken = (AssertionError, ft.DataDependentOutputException, ft.DynamicOutputShapeException,
              ft.UnsupportedOperatorException)

    class SimulatedGPUMode(ft.FakeTensorMode):
        def __init__(self, **kwargs):
            self._kernel, self.broke = threading.local(), []   # (error, op) the simulation raised
            super().__init__(**kwargs)

        @property
        def avoid_device_init(self):
            return True   # torch.tensor(..., device=cuda:i) stays fake, never made on cuda:i

        def __deepcopy__(self, memo):
            return self   # a copied simulated tensor stays on these GPUs (its thread-local flag)

        @property
        def in_kernel_invocation(self):
            return getattr(self._kernel, "on", False)

        @in_kernel_invocation.setter
        def in_kernel_invocation(self, value):
            self._kernel.on = value

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is _PIN:        # pinned host memory: a copy, as on a machine with a GPU
                func, args, kwargs = torch.ops.aten.clone.default, args[:1], {}
            with one_simulated_op(self.broke):
                try:
                    return super().__torch_dispatch__(func, types, args, kwargs)
                except broken as e:     # noted: raised in a thread, the answer never sees it
                    self.broke.append((e, func))
                    raise

    return SimulatedGPUMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def _no_real_gpu_context():
    """FakeTensorMode creates a real tensor on each CUDA device a fake tensor names, where CUDA
    is available (torch 2.11-2.14 `init_gpu_context`): a device this machine lacks raises
    "invalid device ordinal". The simulated GPUs need no real context: skip it."""
    ft = _fake_tensor_module()
    saved = getattr(ft, "init_gpu_context", None)
    if saved is None:                  # another torch: nothing to skip
        yield
        return
    ft.init_gpu_context = lambda device: None
    try:
        yield
    finally:
        ft.init_gpu_context = saved


class FakeGPUs:
    """k simulated GPUs. `tensor(t, i)` copies a real tensor's shape, dtype (and requires_grad)
    to cuda:i; `run(fn, *args)` runs the answer on them and returns (its result, the Recorder)."""

    def __init__(self, k):
        self.k = k
        self.mode = _simulated_mode()
        self.devices = [torch.device("cuda", i) for i in range(k)]

    def tensor(self, t, i=0, requires_grad=None):
        """A fake copy of `t` on devices[i] (a leaf; requires_grad as `t` unless given)."""
        with _no_real_gpu_context(), self.mode:
            f = self.mode.from_tensor(t.detach()).to(self.devices[i])
        if requires_grad if requires_grad is not None else t.requires_grad:
            f.requires_grad_()
        return f

    @contextlib.contextmanager
    def active(self, races=None):
        """The fake mode with a recorder on top, and the patches fake devices need; `races`
        (stream_races.py) notes the stream of each operation the recorder sees."""
        races = Races(Waits()) if races is None else races
        recorder = stream_recorder(races, answer_scalars=True)
        with _fake_module_moves(self.mode), simulated_cuda(races.waits, self.k), \
                _no_real_gpu_context(), watch_exits(_no_callbacks_on_fakes), \
                _ArraysOfFakesCarriedMode(), \
                _DataSetterCarriedMode(self.mode), self.mode, recorder:
            yield recorder

    def run(self, fn, *args, what="your code", **kwargs):
        """fn(*args, **kwargs) on the fake devices: (result, recorder). An operation that mixes
        devices fails the check naming the tensors and their devices; an operation the
        simulation cannot run is the harness's error, not the answer's."""
        ft = _fake_tensor_module()
        check_declared(fn)
        races = Races(Waits())
        with self.active(races) as recorder:
            recorder.replay = values_read(fn, args, kwargs)   # the CPU run's reads, in order
            try:
                out = fn(*args, **kwargs)
                self._unbroken(recorder, what)
                race = races.found or races.unwaited(handed(args, kwargs, out))
                if race is not None:
                    raise CheckFailed(f"{what} {race}")
            except RuntimeError as e:         # torch 2.14: FakeTensorDeviceMismatchError
                self._unbroken(recorder, what)
                if _mixes_devices(e):
                    raise CheckFailed(mixed_devices(recorder, what)) from e
                if _real_gpu_reached(e):
                    raise HarnessError(not_stood_in(self.k, e)) from e
                if isinstance(e, HarnessError) or not (_needs_values(e) or recorder.answered):
                    raise
                raise HarnessError(_values_unknown(recorder, e, what)) from e
            except (ft.DataDependentOutputException, ft.DynamicOutputShapeException,
                    ft.UnsupportedOperatorException) as e:
                raise HarnessError(_values_unknown(recorder, e, what)) from e
            except (CheckFailed, HarnessError):
                raise
            except Exception as e:            # an assert on a value read as a placeholder
                self._unbroken(recorder, what)
                if not recorder.answered:
                    raise
                raise HarnessError(_values_unknown(recorder, e, what)) from e
        compare_work(fn, what, recorder.answered)
        return out, recorder

    def _unbroken(self, recorder, what):
        """The simulation's own error in any thread (one the answer started included, where it
        kills that thread and the answer then fails elsewhere): the grader's problem."""
        if not self.mode.broke:
            return
        e, func = self.mode.broke[0]
        if isinstance(e, HarnessError):
            raise e
        if not isinstance(e, AssertionError):
            raise HarnessError(_values_unknown(recorder, e, what)) from e
        first = str(e).splitlines()[0] if str(e) else ""
        raise HarnessError(f"torch's simulation of the GPUs failed inside {func} (AssertionError"
                           f"{': ' + first if first else ''}) while {what} ran: the grader's "
                           "problem, not a verdict on your answer; run the check again") from e


def _needs_values(e):
    """A data-dependent operation, raised through a dispatch mode as a RuntimeError."""
    return any(name in str(e) for name in ("DataDependentOutputException",
                                           "DynamicOutputShapeException"))


def _values_unknown(recorder, e, what):
    """The grader's limit, in words: the simulated GPUs hold no values."""
    first = str(e).splitlines()[0] if str(e) else ""
    name = recorder.failed[0] if recorder.failed else type(e).__name__
    read = (f" after reading {recorder.answered} value(s) out of tensors, which the simulated "
            "GPUs answer with placeholders (0, False; True for all() and allclose)"
            if recorder.answered else "")
    return (f"{what} raised {type(e).__name__} ({name}: {first}) on the simulated GPUs{read}. "
            "They hold no values, only shapes and devices, so a result that depends on values "
            "(a size read from a tensor, a check of values) cannot be known there: this is the "
            "grader's limit, not a verdict on your answer, whose values are judged on CPU "
            "tensors. Keep value checks (asserts on sums, allclose) outside the function the "
            "check calls, or compute sizes from shapes, and run the check again")


def _no_callbacks_on_fakes(t, how):
    """apply_, map_, map2_ on a simulated tensor: refused (torch's kernel would read memory a
    fake tensor does not have, and crash the interpreter)."""
    if how.strip(".()") in CALLBACKS and isinstance(t, _fake_tensor_module().FakeTensor):
        raise CheckFailed(f"your code called {how} on a tensor of the simulated GPUs: it hands "
                          "every element to a Python function, which the simulated devices "
                          "cannot run (they hold no values), and real GPUs refuse (it runs on "
                          "CPU tensors only); compute with tensor operations")


_NUMPY = types.MappingProxyType({getattr(torch, name): np.dtype(name) for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
    "complex64", "complex128")})
_TO_NUMPY = frozenset({id(torch._C.TensorBase.numpy)})   # or torch.Tensor's (exits.py's stand-in)
_FUNCTION = types.FunctionType


class _ArraysOfFakesCarriedMode(CarriedFunctionMode):
    """`.numpy()` and `np.asarray` of a simulated tensor (torch refuses them for any tensor
    subclass): on the CPU, its elements read as its `.tolist()` reads them (each answered by the
    CPU run's value where the reads replay, placeholders.py); on a GPU, TypeError, as torch
    raises there. Carried into the threads the answer starts (carried.py)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and is_a(args[0], fake_tensor.FakeTensor) and (id(func) in _TO_NUMPY or (
                type(func) is _FUNCTION and func.__name__ in ("numpy", "__array__"))):
            return _array_of(args[0], kwargs.get("dtype"), kwargs.get("force", False))
        return func(*args, **kwargs)


_DATA = torch._C.TensorBase.data        # the attribute whose setter `t.data = new` runs


class _DataSetterCarriedMode(CarriedFunctionMode):
    """`t.data = new` as on real devices: `t` takes `new`'s storage and its device (Module._apply
    moves parameters so on GPUs). Unhelped, a simulated `t` keeps its old device and a real `t`
    given a simulated tensor's data reads as "meta". Carried into the answer's threads."""

    def __init__(self, mode):
        super().__init__()
        self.fake_mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (getattr(func, "__self__", None) is _DATA and getattr(func, "__name__", "") == "__set__"
                and len(args) == 2 and not kwargs):
            with one_simulated_op():
                return _set_data(self.fake_mode, *args)
        return func(*args, **(kwargs or {}))


def _set_data(mode, t, new):
    """`t.data = new` under the simulated GPUs (above)."""
    fake = fake_tensor.FakeTensor
    if not is_a(new, fake) and not is_a(t, fake):
        return _DATA.__set__(t, new)
    if not is_a(new, fake):                 # a real tensor's data: it lives where that one does
        new = mode.from_tensor(new)
    if is_a(t, fake):
        _DATA.__set__(t, new)
        t.fake_device = new.fake_device
        return None
    if t.grad is not None:
        raise HarnessError("your code gave a tensor that has a .grad the data of a tensor on the "
                           f"simulated {describe_device(new.device)} (.data = ...): the simulated "
                           "GPUs cannot move a tensor with its gradient that way. Not a verdict "
                           "on your answer: move the module (.to(device)) or set p.grad = None "
                           "first, and run the check again")
    moved = new.detach().requires_grad_(t.requires_grad)
    if is_a(t, torch.nn.Parameter):
        moved._is_param = True              # still an nn.Parameter, as Module._apply's swap
    for name, value in vars(t).items():
        vars(moved).setdefault(name, value)
    _forget(mode, t)                        # the fake mode's weak reference to t refuses a swap
    try:
        torch.utils.swap_tensors(t, moved)  # the same object, now a tensor of `new`'s device
    except RuntimeError as e:
        raise HarnessError(f"the simulated GPUs could not give a tensor the data of one on "
                           f"{describe_device(new.device)} (.data = ...): {e}. Not a verdict on "
                           "your answer: move modules with .to(device), tensors with "
                           "t = t.to(device), and run the check again") from e
    return None


def _forget(mode, t):
    """Drop the fake mode's record of the real tensor `t` (made when a view of it, `t.data`, was
    converted): a weak reference, which `swap_tensors` refuses."""
    converter = getattr(getattr(mode, "fake_tensor_converter", None), "meta_converter", None)
    lookup = getattr(getattr(converter, "describer", None), "lookup_tensor", None)
    if lookup is not None and t in lookup:
        del lookup[t]


def _array_of(t, dtype=None, force=False):
    """The array torch's `.numpy()` (`force`: a copy from any device) would give, or its error,
    with the elements read as the simulated tensor's `.tolist()` reads them."""
    if t.device.type != "cpu" and not force:
        raise TypeError(f"can't convert {t.device} device type tensor to numpy. Use Tensor.cpu() "
                        "to copy the tensor to host memory first.")
    if t.requires_grad and not force:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                           "tensor.detach().numpy() instead.")
    if t.dtype not in _NUMPY:
        raise TypeError(f"Got unsupported ScalarType {str(t.dtype).split('.')[-1]}")
    values = np.array(t.tolist(), dtype=_NUMPY[t.dtype]).reshape(tuple(t.shape))
    return values if dtype is None else values.astype(dtype, copy=False)


def _mixes_devices(e):
    text = str(e)
    return any(words in text for words in ("Expected all tensors to be on the same device",
                                           "found at least two devices",
                                           "found two different devices"))   # torch 2.11


def _real_gpu_reached(e):
    """An error of the real CUDA runtime: the simulation reached it (fake tensors never run on
    a GPU, so an answer cannot cause one here)."""
    text = str(e)
    return type(e).__name__ == "AcceleratorError" or any(words in text for words in (
        "CUDA error", "invalid device ordinal", "out of index range", "CUDA driver",
        "no NVIDIA driver", "not compiled with CUDA", "Backend doesn't support"))


def mixed_devices(recorder, what="your code"):
    """The reader's words for the operation that mixed devices."""
    if recorder.failed is None:
        return (f"{what} mixed tensors on different devices in one operation: on real GPUs "
                "that raises; move each tensor to the device that computes with it first")
    name, refs = recorder.failed
    places = sorted({describe_device(r.device) for r in refs})
    parts = ", ".join(f"a {list(r.shape)} tensor on {describe_device(r.device)}" for r in refs)
    return (f"{what} ran {name} on {parts}: one operation on {' and '.join(places)} raises on "
            "real GPUs; move each tensor to the device that computes with it first "
            "(.to(device))")


@contextlib.contextmanager
def _fake_module_moves(mode):
    """`module.to(device)` on fake parameters swaps tensors, which refuses tensors with weak
    references; the fake mode's memo holds some. Drop those entries before a swap."""
    original = torch.utils.swap_tensors

    def swap(t1, t2):
        with one_simulated_op():        # the memo is the mode's, shared by the threads
            memo = getattr(getattr(mode, "fake_tensor_converter", None), "tensor_memo", None)
            if memo is not None:
                for key, value in list(memo.items()):
                    if value is t1 or value is t2:
                        del memo[key]
            return original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original
