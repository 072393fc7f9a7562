"""No reference shortcut: while a check runs, the course's own answer to the exercise is out of
reach of the reader's answer.

Two guards, by identity, so that a name bound earlier (`spl = helpers.saved_per_layer`) does not
slip through:
- `scan` walks what the answer's code can reach before it runs (reach.py): the globals and
  module attributes its bytecode loads, its closure and defaults, the objects they hold and their
  classes' members, recursively through the reader's own functions and classes and the course's
  helpers (whose code may call the reference in turn);
- `blocked` (stubs.py) gives the reference's function object a stub's code while the answer
  runs, so a lookup the scan cannot see (getattr with a computed name, a binding made before
  the check in a deque, an object or a worker thread) raises ReferenceUsed inside the answer.
A function is identified by what its code is (its bytecode, names and constants, nested code
included), not by where or under which name it was defined: the fresh copy of the course that
grading imports (fresh.py), a copy renamed with `CodeType.replace`, rebuilt from its source with
`exec`, imported again under another name, or compiled by torch (compiled.py) are all the same
reference (guard.py refuses the copies made while the answer runs). An answer that reaches the
checks, their fake tensors, or the introspection that reads another frame is refused as well."""
import atexit
import gc
import hashlib
import importlib
import inspect
import logging
import signal
import sys
import threading
import traceback
import types
import weakref

from torch._ops import OpOverload, OpOverloadPacket, _OpNamespace

from . import bytecode, exits
from .compiled import compiled_origin
from .guard import TORCH_OPERATORS
from .keys import str_keys
from .reach import CONTAINERS, children, readers_class
from .reader_objects import SCALARS, attr, is_a
from .run import CheckFailed
from .switches import _DISPATCH_OFF_NAMES
from .whose import made_by_reader

__all__ = ["resolve", "scan", "blocked", "identity", "Reference", "split_size_copies"]

_PACKAGE = __name__.split(".checks.")[0]        # "helpers" (or the fresh copy's name)
_COURSE = frozenset({_PACKAGE, "helpers"})      # the fresh copy guards the notebook's helpers
_FACADE = importlib.import_module(_PACKAGE)     # bound now: never looked up in sys.modules later
_HARNESS_MODULES = ("torch._subclasses", "torch.utils._python_dispatch", "torch.overrides")
# id(code) -> (code, code_key): found by identity (hashing a code reads it all); a default
# argument of code_key, no module attribute: an entry put there would give the reader's code the
# key of the course's own answer (a block's guard.py and stubs.py judge by it)
_CODE_KEYS = {}
_TYPE_MODULE = type.__dict__["__module__"].__get__
_TYPE_QUALNAME = type.__dict__["__qualname__"].__get__
# the harness's code, which an answer may not consult; any other object of its was made by a
# check (handed to an earlier call, or returned), and kept
_CODE = (types.ModuleType, type, types.FunctionType, types.MethodType, types.CodeType,
         types.BuiltinFunctionType, staticmethod, classmethod, property)


class Reference:
    """A course object the exercise asks the reader to write: its façade name and identity.
    `whose` says whose copy it is in a refusal (a subclass for torch's: `TorchReference`)."""
    whose = "the course's own answer"

    def __init__(self, name, obj):
        self.name, self.obj, self.key = name, obj, identity(obj)

    def __repr__(self):
        return f"helpers.{self.name}"


def code_key(code, _CODE_KEYS=_CODE_KEYS):
    """What a code object is, not where it was defined: a hash of its bytecode, the names and
    constants it uses and its arguments, nested code included. Left out: file, line, name, the
    docstring and the names of local variables (the bytecode refers to locals by position), so
    a copy with its docstring replaced or its locals renamed is the same code."""
    hit = _CODE_KEYS.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    if not str_keys((code.co_names, code.co_varnames)):   # a str subclass's repr: unread
        return f"object:{id(code)}"
    body = code.co_consts
    if code.co_name != "<lambda>" and body and (type(body[0]) is str or body[0] is None):
        body = body[1:]                  # a function's first constant: its docstring or None
    consts = [bytecode.const_key(const, code_key) for const in body]
    text = repr((bytecode.instructions(code), tuple(consts), code.co_names, len(code.co_varnames),
                 len(code.co_freevars), len(code.co_cellvars), code.co_argcount,
                 code.co_kwonlyargcount, code.co_flags))
    if len(_CODE_KEYS) >= 16384:
        _CODE_KEYS.clear()
    _CODE_KEYS[id(code)] = hit = (code, hashlib.sha1(text.encode()).hexdigest())
    return hit[1]


del _CODE_KEYS


def identity(obj):
    """A key that is the same for one function wherever and under whatever name it was defined
    (code_key). Classes by module path (without the package's name) and qualified name."""
    obj = attr(obj, "__func__", obj)
    obj = attr(obj, "__wrapped__", obj)
    code = attr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        return ("code", code_key(code))
    if is_a(obj, type):     # read by type's own getters: a `__module__` property never runs
        module, name = _TYPE_MODULE(obj), _TYPE_QUALNAME(obj)
        if type(module) is str and type(name) is str:
            return ("class", module.split(".", 1)[-1], name)
        return ("id", id(obj))
    origin = compiled_origin(obj)
    return identity(origin) if origin is not None else ("id", id(obj))


class TorchReference(Reference):
    """torch's own copy of what an exercise asks the reader to write, named by its dotted path
    ("torch.distributed.utils._replace_by_prefix"), refused like the course's."""
    whose = "torch's copy of what the exercise asks for"

    def __repr__(self):
        return self.name


def _torch_object(dotted):
    """The object at a dotted path in torch (its longest importable module, then attributes);
    None where this build of torch lacks it (then there is nothing to refuse)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def torch_objects(names):
    """(name, object) of torch's copies among `names`, imported now: a check's declaration
    binds them, so its resolve imports nothing (no lookup in sys.modules) when it runs."""
    return tuple((name, _torch_object(name)) for name in names if name.startswith("torch."))


def torch_family(base):
    """The dotted names of the methods of torch's class at `base` ("torch.x._LoadBalancer") and
    of every torch subclass of it loaded now: each sibling computes what the exercise asks for,
    so a check refuses the whole family, one torch adds later included, not the one it named."""
    root = _torch_object(base)
    names, todo, seen = [], [root] if isinstance(root, type) else [], set()
    while todo:
        cls = todo.pop(0)
        if cls in seen or not cls.__module__.startswith("torch."):
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        names.extend(f"{cls.__module__}.{cls.__qualname__}.{name}"
                     for name, member in vars(cls).items() if not name.startswith("__")
                     and isinstance(member, (types.FunctionType, staticmethod, classmethod)))
    return names


def split_size_copies():
    """torch's own copies of torch.chunk's split-size arithmetic, in pure Python that no Recorder
    sees (every method of DTensor's `Shard`, its sharding helpers, ShardedTensor's chunk spec,
    functorch's vmap chunks): the checks whose exercise is that arithmetic refuse them, as they
    refuse a chunk measured."""
    return [*torch_family("torch.distributed.tensor.placement_types.Shard"),
            "torch.distributed.tensor._utils.compute_local_shape_and_global_offset",
            "torch.distributed.tensor._utils._compute_local_shape_and_global_offset",
            "torch.distributed.tensor._utils._get_shard_size_and_offsets",
            "torch.distributed._shard.sharding_spec._internals.get_split_size",
            "torch.distributed._shard.sharding_spec._internals.get_chunked_dim_size",
            "torch.distributed._shard.sharding_spec._internals.get_chunk_sharding_params",
            "torch._functorch.vmap.get_chunk_sizes"]


def resolve(names, torch_found=None):
    """The References for façade names ("balanced_cuts", "ByteLog.wire_bytes") and for torch's
    copies of the exercise, named from "torch." on (`torch_found`: torch_objects' pairs)."""
    found = dict(torch_objects(names) if torch_found is None else torch_found)
    refs = []
    for name in names:
        if name.startswith("torch."):
            obj = found.get(name)
            if obj is not None:
                refs.append(TorchReference(name, obj))
            continue
        obj = _FACADE
        for part in name.split("."):
            obj = getattr(obj, part)
        refs.append(Reference(name, obj))
    return tuple(refs)


def _is_harness(obj):
    """The checks (this package) or the machinery that simulates devices for them."""
    name = obj.__name__ if is_a(obj, types.ModuleType) else attr(obj, "__module__", "")
    return type(name) is str and name.startswith(
        (*(f"{p}.checks" for p in _COURSE), *_HARNESS_MODULES))


# what reads another frame or the objects the check holds (guard.py refuses it at run time too)
_INTROSPECTION_NAMES = {"_getframe", "_current_frames", "_current_exceptions", "currentframe",
                        "getouterframes", "getinnerframes", "get_referrers", "get_referents",
                        "get_objects", "f_back", "f_locals", "f_globals", "tb_frame", "tb_next",
                        "gi_frame", "cr_frame", "ag_frame", "settrace", "setprofile",
                        "_getframemodulename",
                        # the closures the harness keeps its records in (ledger.py)
                        "__closure__", "cell_contents", "__defaults__", "__kwdefaults__",
                        # the tables of a module's or parameter's hooks, where checks observe
                        "_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                        "_forward_hooks_with_kwargs", "_backward_pre_hooks",
                        "_post_accumulate_grad_hooks"}
_INTROSPECTION_NAMES = frozenset(_INTROSPECTION_NAMES)
_INTROSPECTION = types.MappingProxyType({id(f): f"{m.__name__}.{f.__name__}" for m, names in (
    (sys, ("_getframe", "_current_frames", "settrace", "setprofile", "exc_info")),
    (inspect, ("currentframe", "stack", "trace", "getouterframes", "getinnerframes",
               "getframeinfo")),
    (logging, ("currentframe",)),
    (traceback, ("extract_stack", "walk_stack", "format_stack", "print_stack", "walk_tb")),
    (gc, ("get_referrers", "get_referents", "get_objects")),
    (threading, ("settrace", "setprofile"))) for f in [getattr(m, n, None) for n in names]
    if f is not None})




def _dispatch_off(obj):
    """The dispatch switch `obj` is or names in its own code (the reader's), or None."""
    name = attr(obj, "__name__", None)
    if name in _DISPATCH_OFF_NAMES and str(attr(obj, "__module__", "")).startswith("torch"):
        return name
    return _names_in_reader_code(obj, _DISPATCH_OFF_NAMES)


def _names_in_reader_code(obj, names):
    """The first (alphabetically) of `names` that `obj`'s own code names, nested code included,
    where that code is the reader's; else None."""
    code = attr(obj, "__code__", None)
    if isinstance(code, types.CodeType) and made_by_reader(code):
        for c in bytecode.nested(code):
            found = names.intersection(c.co_names)
            if found:
                return min(found)
    return None


# what installs the reader's code to run after its function returned, process-wide (guard.py and
# callbacks.py refuse those reached by a name built at run time)
_LATER = types.MappingProxyType({id(obj): name for name, obj in (
    ("sys.addaudithook", sys.addaudithook), ("atexit.register", atexit.register),
    ("gc.callbacks", gc.callbacks), ("weakref.finalize", weakref.finalize),
    ("signal.signal", signal.signal), ("signal.setitimer", signal.setitimer),
    ("sys.monitoring", getattr(sys, "monitoring", sys.addaudithook)))})
_LATER_NAMES = frozenset({"addaudithook", "excepthook", "displayhook", "unraisablehook",
                          "breakpointhook", "set_asyncgen_hooks", "meta_path", "path_hooks",
                          "setitimer", "_register_hook_dict"})
# what defines or calls an operator of its own: the work inside one runs under no Recorder (the
# dispatch mode is popped while an operator runs), so it would be invisible to the check
_OPERATOR_MODULES = ("torch.library", "torch._library", "torch._custom_op", "torch._custom_ops")


def _later(obj):
    """The process-wide callback `obj` is or names in its own code (the reader's), or None."""
    return _LATER.get(id(obj)) or _names_in_reader_code(obj, _LATER_NAMES)


def _operator(obj):
    """The operator machinery `obj` is (torch.library, an operator outside aten), or None."""
    if is_a(obj, _OpNamespace):
        name = attr(obj, "name", None) or attr(obj, "__name__", "").rsplit(".", 1)[-1]
        return None if name in TORCH_OPERATORS else f"torch.ops.{name}"
    if is_a(obj, (OpOverload, OpOverloadPacket)):
        space = obj.namespace if is_a(obj, OpOverload) else \
            obj._qualified_op_name.split("::")[0]
        return None if space in TORCH_OPERATORS else f"torch.ops.{space}"
    module = obj.__name__ if is_a(obj, types.ModuleType) else attr(
        obj if callable(obj) else type(obj), "__module__", None)
    if isinstance(module, str) and module.startswith(_OPERATOR_MODULES):
        return module if is_a(obj, types.ModuleType) else attr(
            obj, "__name__", type(obj).__name__)
    return None


def _introspects(obj):
    """The introspection `obj` is or names in its own code (the reader's), or None."""
    if id(obj) in _INTROSPECTION:
        return _INTROSPECTION[id(obj)]
    return _names_in_reader_code(obj, _INTROSPECTION_NAMES)


def scan(fn, refs, exercise, limit=20000):
    """Refuse an answer whose code can reach one of `refs`, or the checks, before running it."""
    if not callable(fn):
        raise CheckFailed(f"expected the function {exercise}, got {type(fn).__name__}")
    keys = {ref.key: ref for ref in refs}
    seen, stack = set(), [(fn, attr(fn, "__name__", exercise))]
    while stack and len(seen) < limit:
        obj, path = stack.pop()
        if id(obj) in seen or is_a(obj, SCALARS) and not callable(obj) and (
                type(obj) in SCALARS or not readers_class(type(obj))):  # the reader's: walked
            continue
        seen.add(id(obj))
        try:
            _examine(obj, path, keys, exercise, stack, obj is fn)
        except CheckFailed:
            raise
        except Exception as e:      # an object of the reader's whose attributes compute
            raise CheckFailed(f"reading {path}, which your code uses, raised {type(e).__name__}"
                              ": keep such an object out of your answer's code") from None


def _examine(obj, path, keys, exercise, stack, answer):
    """Refuse `obj` (reached through `path`) if `scan` must; else push what it reaches."""
    ref = keys.get(identity(obj)) if callable(obj) or is_a(obj, type) else None
    if ref is not None and not bytecode.written_formula(obj, ref.obj, _PACKAGE):
        raise CheckFailed(f"the exercise asks you to write {exercise} yourself, but your "
                          f"code uses {ref} ({ref.whose}), through {path}: it is "
                          "unavailable while the check runs")
    peek = _introspects(obj)
    if peek is not None:
        raise CheckFailed(f"your code inspects the running program ({peek}, through {path}):"
                          " an answer must compute its result, not read the check's frames,"
                          " tracebacks or objects")
    late = _later(obj)
    if late is not None:
        raise CheckFailed(f"your code installs a callback that runs after your function "
                          f"returned ({late}, through {path}): the check judges what your "
                          "function did while it ran, so an answer may leave nothing of its "
                          "own to run later")
    if obj is sys.modules:  # every module by name, as importlib.import_module: not walked
        return              # (its first entries, ctypes among them, are not the answer's code)
    if type(obj) in CONTAINERS:     # a built-in container: what follows never refuses one
        stack.extend((child, f"{path} → {label}") for label, child in children(obj))
        return
    op = _operator(obj)
    if op is not None:
        raise CheckFailed(f"your code defines or calls an operator of its own ({op}, through "
                          f"{path}, torch.library): the work inside one is invisible to the "
                          "check, so an answer must run torch's own operations in plain view")
    out = exits.unwatched(obj) or _names_in_reader_code(obj, exits.UNWATCHED_NAMES)
    out = exits.SCRIPTED if out in exits.SCRIPT_NAMES else (
        exits.RAW_MEMORY if out in exits.RAW_NAMES else out)
    if out is not None:
        raise CheckFailed(f"your code reaches tensor values through {out} (through {path}), "
                          "an unwatched way out of torch: the check watches every way values "
                          "leave torch (.tolist(), .numpy(), .item() ...); call those on "
                          "the tensor itself")
    off = _dispatch_off(obj)
    if off is not None:
        raise CheckFailed(f"your code switches off torch's dispatch ({off}, through {path}): "
                          "the check watches your operations through it, so an answer must "
                          "run them in plain view")
    if not answer and _is_harness(obj) and not is_a(obj, _CODE):
        raise CheckFailed(f"your code holds an object of the checks' ({path}: a "
                          f"{_TYPE_QUALNAME(type(obj))}, or a copy of one), kept from an "
                          "earlier call or an earlier run of a check: what a check hands your "
                          "function, copies included, belongs to that call, and kept across "
                          "calls (a cache, a global) it goes stale; build what you need from "
                          "each call's arguments")
    if not answer and _is_harness(obj):
        raise CheckFailed(f"your code uses the course's checks or their simulated devices "
                          f"({path}): an answer must do the work itself, not consult or "
                          "change the check")
    if not is_a(obj, types.ModuleType):
        stack.extend((child, f"{path} → {label}") for label, child in children(obj))


from .stubs import blocked  # noqa: E402  (stubs.py reads identity above)
