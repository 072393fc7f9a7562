"""Fresh inputs for checks, what an answer returns read as numbers, and copies of the inputs
that let a check compute its expected value after the answer (kept, expect_unchanged).

Inputs come from a generator seeded by the operating system (never torch's global one: a check
must not change the notebook's random numbers); the course's tests replay fixed seeds instead.
The seed is read from `os.urandom` bound at import and verified to be the operating system's at
each draw, never through `random.SystemRandom`'s Python methods, which a cell could patch: draws
made repeatable would let a table learnt from the failure messages (which name the expected
value) pass.
Numbers are accepted in any real type (int, float, numpy scalars, 0-d tensors); tolerances come
from the rounding of the expected computation (float32 widens them a little; a number in half
precision is refused: the answer does not choose its tolerance), not from luck.
"""
import decimal
import io
import numbers
import os
import random
import sys
import types

import torch

from .run import CheckFailed, expect
from .settle import reader_class

__all__ = ["fresh_generator", "replay_seeds", "randint", "uniform", "as_number", "as_int",
           "as_pair", "unit_roundoff", "gamma", "rel_close", "same_number", "number_words",
           "tensor_close", "tensor_equal", "kept", "expect_unchanged"]

# The course's own test suite replays the same draws on every run (tests/conftest.py calls
# replay_seeds per test): inputs stay fresh from call to call, and a rare unlucky draw cannot
# make CI flaky. Readers and graders always get seeds from the operating system: whether this
# process is a pytest run's is read from the operating system (its command line), never from a
# variable of the process, and again at each replayed draw.
_SEEDS = None
_URANDOM = os.urandom          # bound at import; verified at each draw (_os_seed)
_C_TYPE = 1 << 8               # Py_TPFLAGS_IMMUTABLETYPE: no class statement makes one
_FILE = io.FileIO              # a C type (verified): reads the command lines


def replay_seeds(seed):
    """Draw check inputs from a sequence seeded with `seed` (None: the operating system again).
    The test suite's alone: refused outside a pytest process (in a notebook, repeatable draws
    would let a table of the expected values the failure messages name pass; `fresh.regrade`'s
    own import of the checks never replays)."""
    global _SEEDS
    if seed is not None and not _under_pytest():
        raise RuntimeError("replay_seeds is the course's test suite's: checks draw fresh cases "
                           "from the operating system on every call")
    _SEEDS = None if seed is None else random.Random(seed)


def _under_pytest():
    """Whether this process runs pytest: its command line names pytest (`pytest ...`, `python -m
    pytest ...`), or it is a pytest-xdist worker (execnet's bootstrap) of a process that does.
    Read from /proc, which no cell rewrites (an environment key, `sys.argv` or a module in
    sys.modules are the process's own, any cell sets them); without /proc, `sys.orig_argv`."""
    if not (isinstance(_FILE, type) and _FILE.__flags__ & _C_TYPE and _FILE.__name__ == "FileIO"):
        return False
    try:
        own = _command_line("self")
        return _runs_pytest(own) or (own[-2:] == ["-c", _EXECNET] and _runs_pytest(
            _command_line(str(os.getppid()))))
    except OSError:              # no /proc (macOS, Windows)
        return _runs_pytest(list(getattr(sys, "orig_argv", ())))


_EXECNET = "import sys;exec(eval(sys.stdin.readline()))"     # pytest-xdist's workers start so


def _command_line(pid):
    with _FILE(f"/proc/{pid}/cmdline") as f:
        return [a.decode(errors="replace") for a in f.readall().split(b"\0")[:-1]]


def _runs_pytest(argv):
    """`argv` runs pytest: its program or script is pytest's, or it is `python -m pytest`."""
    names = [a.replace("\\", "/").rsplit("/", 1)[-1] for a in argv[:2]]
    return any(n in ("pytest", "py.test", "pytest.exe") for n in names) or any(
        argv[i:i + 2] == ["-m", "pytest"] for i in range(1, min(len(argv), 4)))


def fresh_generator(seed=None):
    """A random generator for fresh check inputs (a new seed each call unless given). Torch's
    functions that the checks draw with are verified to be torch's own first (_expect_torch)."""
    _expect_torch()
    if seed is None:
        replayed = _SEEDS is not None and _under_pytest()
        seed = _SEEDS.randrange(2**31) if replayed else _os_seed()
    return _GENERATOR().manual_seed(seed)


def _os_seed():
    """31 bits from the operating system: `os.urandom` as bound at import, refused unless it is
    the C function of os's own module (a cell that replaced it before the checks were imported
    would fix every draw)."""
    f = _URANDOM
    if not (isinstance(f, types.BuiltinFunctionType) and f.__name__ == "urandom"
            and getattr(f.__self__, "__name__", None) in ("posix", "nt")):
        raise CheckFailed("os.urandom is not the operating system's (code of yours replaced it): "
                          "the check draws its cases from it, and fixed draws cannot judge an "
                          "answer. Put the original back, or restart the kernel")
    return int.from_bytes(f(4), "little") & 0x7FFFFFFF


# What the checks draw with, looked up in torch's namespace at each draw (`torch.randn(...,
# generator=g)`): verified at each fresh_generator to be torch's own C functions and types (a
# cell that rebinds `torch.Generator` to a class whose manual_seed ignores the seed, or
# `torch.randn` to fixed values, would make every draw the same, `fresh.regrade`'s included).
_GENERATOR, _RANDINT, _RAND = torch.Generator, torch.randint, torch.rand    # bound at import
_FUNCTIONS = ("randn", "rand", "randint", "randperm", "normal", "empty", "zeros", "tensor")
_METHODS = ("normal_", "uniform_", "random_", "item")       # torch.Tensor's, from TensorBase
_BUILTIN, _DESCRIPTOR = type([].append), type(str.join)     # from literals: no name to rebind


def _expect_torch():
    """CheckFailed naming the first of torch's drawing functions or types that is not torch's."""
    for name, f in (("torch.Generator", torch.Generator), ("torch.Generator", _GENERATOR)):
        if not (isinstance(f, type) and f.__flags__ & _C_TYPE and f.__name__ == "Generator"):
            _replaced(name)
    for name, f in (*((n, getattr(torch, n, None)) for n in _FUNCTIONS),
                    ("randint", _RANDINT), ("rand", _RAND)):
        if not (type(f) is _BUILTIN and f.__self__ is None and f.__name__ == name):
            _replaced(f"torch.{name}")
    for name in _METHODS:
        f = getattr(torch.Tensor, name, None)
        owner = getattr(f, "__objclass__", None)
        if not (type(f) is _DESCRIPTOR and f.__name__ == name and isinstance(owner, type)
                and owner.__flags__ & _C_TYPE and owner.__name__ == "TensorBase"):
            _replaced(f"torch.Tensor.{name}")


def _replaced(what):
    raise CheckFailed(f"{what} is not torch's own (code of yours replaced it): the check draws its "
                      "cases with it, and fixed draws cannot judge an answer. Put the original "
                      "back, or restart the kernel")


def randint(g, low, high):
    """A random int in [low, high] (both included) drawn from generator `g`."""
    _expect_torch()
    return _RANDINT(low, high + 1, (), generator=g).item()     # no builtin int() looked up


def uniform(g, low, high):
    """A random float in [low, high) drawn from generator `g`."""
    _expect_torch()
    return low + (high - low) * _RAND((), generator=g, dtype=torch.float64).item()


_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11,
             torch.bfloat16: 2.0**-8}
_ROUNDOFF = types.MappingProxyType(_ROUNDOFF)


def unit_roundoff(dtype=torch.float64):
    """u = half the machine epsilon of `dtype`: one rounding changes a value by at most u·|x|."""
    return _ROUNDOFF.get(dtype, 2.0**-53)


def gamma(n, dtype=torch.float64):
    """Higham's γ_n = n·u / (1 - n·u): the relative error bound of n roundings in a row."""
    u = unit_roundoff(dtype)
    return n * u / (1 - n * u)


def rel_close(got, want, steps, dtype=torch.float64):
    """|got - want| <= γ_steps(dtype)·|want| (or, for want == 0, got == 0)."""
    return abs(got - want) <= gamma(steps, dtype) * abs(want)


# Comparing tensors: shape first. torch.allclose and friends broadcast, so an empty
# `t[None][:0]` is "close" to anything; a check compares a result only once it has the expected
# shape and kind of values. Bound at import: what the answer rebinds later cannot bend them.
# Compared with tensor subclasses' `__torch_function__` off: a subclass of the reader's that
# got past settle.py still cannot answer the comparison (torch's own subclasses dispatch below).
_ALLCLOSE, _EQUAL, _PROMOTE = torch.allclose, torch.equal, torch.promote_types
_PLAIN_DISPATCH = torch._C.DisableTorchFunctionSubclass


def _kind(dtype):
    return ("boolean" if dtype == torch.bool else "complex" if dtype.is_complex
            else "floating-point" if dtype.is_floating_point else "integer")


def _comparable(got, want, what):
    """`got` and `want` in one dtype, or fail unless `got` is a tensor of `want`'s shape and
    kind of values (floating, integer, boolean); any precision of that kind is compared."""
    shape = tuple(want.shape)
    if not issubclass(type(got), torch.Tensor):     # by type: no `__class__` property runs
        raise CheckFailed(f"{what} is {type(got).__name__}, expected a tensor of shape {shape}")
    if reader_class(type(got)):         # read as a plain tensor: no property of its class runs
        got = torch._C.TensorBase.as_subclass(got, torch.Tensor)
    expect(tuple(got.shape) == shape,
           f"{what} has shape {tuple(got.shape)}, expected shape {shape}: return exactly that "
           "shape (values compared across another shape would broadcast)")
    expect(_kind(got.dtype) == _kind(want.dtype),
           f"{what} holds {_kind(got.dtype)} values ({got.dtype}), expected "
           f"{_kind(want.dtype)} ones like {want.dtype}")
    dtype = _PROMOTE(got.dtype, want.dtype)
    return got.to(dtype), want.to(dtype)


def tensor_close(got, want, rtol=1e-5, atol=1e-8, what="a result"):
    """torch.allclose(got, want), shape-strict: fails (CheckFailed naming the expected shape)
    unless `got` is a tensor of `want`'s shape and kind of values, then compares the values."""
    with _PLAIN_DISPATCH():
        got, want = _comparable(got, want, what)
        return _ALLCLOSE(got, want, rtol=rtol, atol=atol)


def tensor_equal(got, want, what="a result"):
    """torch.equal(got, want), shape-strict as tensor_close."""
    with _PLAIN_DISPATCH():
        got, want = _comparable(got, want, what)
        return _EQUAL(got, want)


# A number's tolerance is the rounding of the computation the check expects (float64 steps on
# the Python numbers it hands over), which float32 hardly widens (γ_16 ≈ 1e-6, below any mistake
# a check names). A half-precision type would let the answer pick a tolerance of percents (γ_16
# of bfloat16 ≈ 7 %, wide enough to pass a wrong formula): it is refused, never widened to.
_NUMPY_PRECISION = types.MappingProxyType({"float32": torch.float32, "float16": torch.float16})


def _precision(value, what):
    """The dtype the answer's number was computed in (for its tolerance): float64 for Python
    numbers, float32 for a float32 tensor or numpy float32; half precision is refused."""
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
    else:
        cls = type(value)       # a numpy scalar or 0-d array: numpy's own (C) class, its dtype;
        genuine = cls.__module__ == "numpy" and bool(cls.__flags__ & _C_TYPE)   # never a claim
        name = str(getattr(value, "dtype", "")) if genuine else ""
        dtype = _NUMPY_PRECISION.get(name, torch.float64)
    if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
        bits = int(1 / torch.finfo(dtype).eps).bit_length()
        raise CheckFailed(
            f"{what} returned a {str(dtype).removeprefix('torch.')} number, which keeps "
            f"{bits} significant bits: too few for the check to tell your formula from a wrong "
            "one near it. Return a Python float (compute in float64, or float(x) of a float32 "
            "or float64 result)")
    return dtype


def as_number(value, what, with_dtype=False):
    """`value` as a Python float: ints, floats, fractions, decimals, numpy scalars and 0-d arrays,
    tensors of one element; or fail saying what came back. `with_dtype=True` also returns the
    dtype the number was computed in (float64 for Python numbers, float32 for float32 types), for
    its tolerance; a number in half precision (float16, bfloat16) is refused: its rounding would
    be a tolerance of the answer's choosing."""
    dtype = _precision(value, what)
    if isinstance(value, torch.Tensor):
        expect(value.numel() == 1, f"{what} returned a tensor of shape {tuple(value.shape)}, "
                                   "expected a single number")
        expect(value.dtype != torch.bool, f"{what} returned a boolean tensor, expected a number")
        value = value.detach().cpu().item()
    elif hasattr(value, "ndim") and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()             # a 0-d numpy array
    expect(not isinstance(value, bool) and type(value).__name__ != "bool_",
           f"{what} returned {value!r}, expected a number")
    if isinstance(value, decimal.Decimal) and value.is_finite():
        value = float(value)             # a Decimal is a number, though not numbers.Real
    if not isinstance(value, numbers.Real):
        raise CheckFailed(f"{what} returned {value!r} ({type(value).__name__}), expected a number")
    number = float(value)
    return (number, dtype) if with_dtype else number


def as_int(value, what):
    """`value` as a Python int, when it is a whole number of any real type (3, 3.0, np.int64)."""
    number = as_number(value, what)
    expect(number == number and abs(number) != float("inf") and number.is_integer(),
           f"{what} returned {value!r}, expected a whole number")
    return int(number)


def as_pair(value, what, names, with_dtype=False):
    """Two numbers returned as a tuple or list (or a 2-element tensor), as floats; with
    `with_dtype=True` also the dtype of the coarser of the two (as_number's)."""
    dtype = torch.float64
    if isinstance(value, torch.Tensor) and value.numel() == 2:
        dtype = _precision(value, what)
        value = value.reshape(-1).tolist()
    expect(isinstance(value, (tuple, list)) and len(value) == 2,
           f"{what} returned {value!r}: expected a pair ({names})")
    pair = [as_number(v, what, with_dtype=True) for v in value]
    if any(d == torch.float32 for _, d in pair):
        dtype = torch.float32
    numbers = tuple(x for x, _ in pair)
    return (numbers, dtype) if with_dtype else numbers


def near(got, want, dtype=torch.float64, steps=16, floor=0.0, scale=None):
    """Whether `got` is `want` up to the rounding of `steps` operations in `dtype` on numbers of
    size `scale` (|want| by default), or to `floor`·scale where the check allows more: how a
    check compares a returned number, so that a float32 computation of the right formula passes
    (with `dtype` from as_number's `with_dtype=True`)."""
    scale = abs(want) if scale is None else scale
    return abs(got - want) <= max(floor, gamma(steps, dtype)) * scale


def shown(got, want, digits=4):
    """`got` and `want` as text with the fewest significant digits (`digits` or more) that tell
    them apart, so that a message never shows one number twice."""
    for d in range(digits, 18):
        a, b = f"{got:.{d}g}", f"{want:.{d}g}"
        if a != b:
            return a, b
    return repr(got), repr(want)


_FLOORED = "a // or int() on the way dropped a fraction: divide with /"


def rounding_note(got, want, dtype):
    """For a number rejected though within float32 rounding of the expected one (a float32
    step whose result came back as a Python float), or a whole number near a fraction (a `//`
    or int() on the way): say so, never only "x, expected x"."""
    if got == want:
        return ""
    whole = float(got).is_integer()
    if whole and not float(want).is_integer() and near(got, want, floor=1e-2):
        return (" (yours is a whole number, the expected value has a fraction: divide with /, "
                "not // or int())")
    if dtype == torch.float64 and near(got, want, torch.float32, 64):
        return (f" (yours is within float32 rounding of it: {_FLOORED}; or a float32 step: "
                "compute in float64 or Python numbers, or return the float32 tensor itself)"
                if whole else " (yours is within float32 rounding of it: compute in float64 or "
                "Python numbers, or return the float32 tensor itself; or "
                f"{_FLOORED})")
    return ""


def same_number(got, want, dtype=torch.float64, steps=16, share=False):
    """How every check compares a returned number: `got` is `want` up to `steps` roundings in
    `dtype` (as_number's), relative to |want|; for a share or fraction (share=True: terms of
    size up to 1) relative to max(|want|, 1), as `1 - sum(others)` is a rounding of 1 away."""
    return near(got, want, dtype, steps, scale=max(abs(want), 1.0) if share else None)


def number_words(got, want, dtype, digits=6, unit=""):
    """`got` and `want` as text that tells them apart (shown), the expected one followed by
    rounding_note's hint: a message never reads "x, expected x" without saying why."""
    a, b = shown(got, want, digits)
    return f"{a}{unit}", f"{b}{unit}{rounding_note(got, want, dtype)}"


# --- expected values come after the answer ------------------------------------------------------
# A check computes its expected value after the answer returned (while the answer runs, nothing
# in the check's frames holds it), from the inputs it gave the answer: so it first keeps a copy
# of them and afterwards requires them unchanged (an answer that edited its inputs would also
# edit the expected value).
def kept(*tensors):
    """Copies of `tensors`' values, taken before the answer runs."""
    return [t.detach().clone() for t in tensors]


def expect_unchanged(call, copies, tensors, names):
    """Fail unless every tensor still holds the values `kept` copied."""
    for copy, t, name in zip(copies, tensors, names, strict=True):
        expect(t.shape == copy.shape and torch.equal(t.detach(), copy),
               f"{call}: your code changed its input {name}; compute from the inputs, leave "
               "them as they are")
