"""Nothing the answer registers acts after it returns. A check goes on using what it handed the
answer (a module's forward, a parameter's backward, an optimizer's step) to compute its expected
value; a hook the answer left on one of them (`register_forward_hook` rewriting the output, a
gradient hook, a step hook) would run the reader's code inside the check and could bend the
target to the answer. So `Answer` lists, before the call, the hooks on what it hands over
(modules and their submodules, parameters, buffers and their gradients, tensors, optimizers,
containers item by item) and the process's global ones (module and optimizer hooks for every
instance, saved-tensor hooks, torch function and dispatch modes left entered), and fails an
answer that returns with one more (and removes it: a hook from its dict, a saved-tensor hook or a
mode popped until the stack's top is one that was there before). Hooks it removed are fine.
Exercises whose lesson is a hook that runs later (DDP's gradient hooks) declare `@check(...,
keeps_hooks=True)`: the reader's hooks left are guarded in place, run as the answer itself."""
import collections
import contextlib
import functools
import itertools
import sys
import threading
import types

import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optim_hooks
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

from .keys import plain_keys
from .parts import base_items, class_attribute, dict_pairs, module_tree, own_dict
from .run import CheckFailed
from .settle import Guarded
from .whose import reader_code

__all__ = ["hooks_of", "expect_no_new_hooks", "node_hooks"]

_DEPTH = 4
_MODULE = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
           "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
           "_load_state_dict_post_hooks")
_TENSOR = ("_backward_hooks", "_post_accumulate_grad_hooks")
_OPTIMIZER = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
              "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
              "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
_GLOBAL = tuple([(module_hooks, n) for n in dir(module_hooks)
           if n.startswith("_global_") and n.endswith("hooks")] + \
          [(optim_hooks, n) for n in ("_global_optimizer_pre_hooks",
                                      "_global_optimizer_post_hooks")])
_GLOBAL_KEYS = frozenset((id(owner), attr) for owner, attr in _GLOBAL)


_ODD = object()         # a hook table holding a key that is not an int or a str
_KEPT = []              # what _take_odd took out: held, so none of it dies


def _take_odd(hooks):
    """Take the keys that are not plain out of a hook table of torch's own type (the table
    emptied and refilled: a lookup would run an odd key's `__eq__`)."""
    items = list(dict.items(hooks))
    _KEPT.append(items)
    kind = type(hooks)
    if kind is dict or kind is collections.OrderedDict:
        kept = [(k, v) for k, v in items if type(k) is int or type(k) is str]
        kind.clear(hooks)
        kind.update(hooks, kept)


_BASE = vars(torch._C.TensorBase)   # a tensor's own getters (a subclass's properties never run)
_GRAD, _IS_LEAF = _BASE["grad"].__get__, _BASE["is_leaf"].__get__
_TENSOR_TABLES = {attr: _BASE[attr].__get__ for attr in _TENSOR if attr in _BASE}


class _Walk:
    """Every hook dict reachable from the handed values: {(owner id, attr): (what, keys)}, read
    by exact types and base getters (what the answer put there after the call: an isinstance,
    hasattr or a subclass's `__iter__` would run its code outside the watched window)."""

    def __init__(self):
        self.found, self.seen = {}, set()

    def table(self, owner, attr, hooks, what):
        if issubclass(type(hooks), dict):     # its keys read by dict's own methods
            keys = frozenset(dict.keys(hooks)) if plain_keys(hooks) else _ODD
            self.found[(id(owner), attr)] = (what, attr, keys, hooks)

    def value(self, v, what, depth):
        if id(v) in self.seen:
            return
        self.seen.add(id(v))
        cls = type(v)
        if issubclass(cls, torch.Tensor):
            for attr, read in _TENSOR_TABLES.items():
                self.table(v, attr, read(v), what)
            grad = _GRAD(v) if _IS_LEAF(v) else None   # a non-leaf's .grad warns, holds none
            if issubclass(type(grad), torch.Tensor):
                self.value(grad, f"the gradient of {what}", depth)
        elif issubclass(cls, torch.nn.Module):
            subs, tensors = module_tree(v)
            for name, sub in subs:
                own = own_dict(sub)
                for attr in _MODULE:
                    self.table(sub, attr, own.get(attr), f"{what}'s layer {name}" if name else what)
            for name, t in tensors:
                self.value(t, f"{what}'s {name}", depth)
        elif issubclass(cls, torch.optim.Optimizer):
            own = own_dict(v)
            for attr in _OPTIMIZER:
                self.table(v, attr, own.get(attr), what)
            for group in base_items(own.get("param_groups")) or ():
                for p in base_items(dict(dict_pairs(group)).get("params")) or ():
                    self.value(p, f"a parameter of {what}", depth)
        elif depth:
            for item in base_items(v) or ():
                self.value(item, what, depth - 1)


def _table_kind(hooks):
    """The base class whose `pop` keeps a hook table whole (an OrderedDict's own links)."""
    return collections.OrderedDict if issubclass(type(hooks), collections.OrderedDict) else dict


def _global():
    found = {}
    for owner, attr in _GLOBAL:
        hooks = getattr(owner, attr, None)
        if issubclass(type(hooks), dict):
            found[(id(owner), attr)] = ("every module" if owner is module_hooks else
                                        "every optimizer", attr, frozenset(dict.keys(hooks))
                                        if plain_keys(hooks) else _ODD, hooks)
    found["saved"] = ("autograd's saved tensors", "saved_tensors_hooks",
                      frozenset(map(id, torch._C._autograd._top_saved_tensors_default_hooks(
                          False) or ())), None)
    found["dispatch"] = ("every torch operation", "a dispatch mode",
                         frozenset(map(id, _get_current_dispatch_mode_stack())), None)
    found["function"] = ("every torch function", "a torch function mode",
                         frozenset(map(id, _function_modes())), None)
    return found


def _function_modes():
    return _get_current_function_mode_stack()


def _saved_top():
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


# the process-wide stacks an answer can leave entered: (its top, pop the top)
_STACKS = types.MappingProxyType({
    "saved": (lambda: _saved_top() and frozenset(map(id, _saved_top())),
              torch._C._autograd._pop_saved_tensors_default_hooks),
    "dispatch": (lambda: _top_id(_get_current_dispatch_mode_stack()), _pop_mode),
    "function": (lambda: _top_id(_function_modes()), torch._C._pop_torch_function_stack)})


def _top_id(stack):
    return frozenset([id(stack[-1])]) if stack else None


def _pop_to(key, before):
    """Pop the stack `key` until its top is one that was there before the answer ran."""
    top, pop = _STACKS[key]
    while (now := top()) and not now <= before:
        pop()


def hooks_of(args, kwargs):
    """The hooks now registered on what an answer is handed, and the process's global ones
    (read with torch functions off: no `__torch_function__` of a tensor subclass runs)."""
    walk = _Walk()
    with torch._C.DisableTorchFunction():
        for i, a in enumerate(args):
            walk.value(a, f"argument {i + 1}", _DEPTH)
        for k, a in kwargs.items():
            walk.value(a, f"`{k}`", _DEPTH)
    return {**walk.found, **_global()}


def expect_no_new_hooks(name, before, args, kwargs, guard=None):
    """CheckFailed naming the hook the answer left registered, if it left one; every hook it
    left is removed first (a failed answer leaves no process-wide hook behind it). `guard` (an
    exercise that keeps hooks): a hook left in a table of what it was handed is guarded in place
    instead (one for every module or optimizer still fails: the check's own forwards run it)."""
    after = hooks_of(args, kwargs)
    left = []
    for key, (what, attr, keys, hooks) in after.items():
        if keys is _ODD:        # a key that is not a handle's id: none is looked up
            left.append((what, attr))
            _take_odd(hooks)
            continue
        new = keys - before.get(key, (None, None, frozenset(), None))[2]
        if new and guard is not None and hooks is not None and key not in _GLOBAL_KEYS:
            for k in new:       # read by dict's own methods: a subclass's never run
                if dict.__contains__(hooks, k) and _unguarded(dict.__getitem__(hooks, k)):
                    guard(hooks, k)     # the hook at `k` guarded in place (kept_hooks.py)
        elif new:
            left.append((what, attr))
            for k in new if hooks is not None else ():
                _table_kind(hooks).pop(hooks, k, None)
            if key in _STACKS:
                _pop_to(key, before[key][2])
    if left:
        what, attr = left[0]
        kind = attr.strip("_").replace("_", " ").removeprefix("a ").removesuffix("s")
        raise CheckFailed(
                f"{name} returned with {kind} still registered on {what}: it would run your "
                "code while the check goes on using that object, after your function returned. "
                "Compute the result inside your function, and remove every hook you register "
                "(handle.remove(), or leave the `with` block) before returning")


# --- hooks on autograd nodes: `t.grad_fn.register_hook`, `register_prehook` ----------------
_NODES = {"depth": 0, "lists": {}}   # thread id -> the lists of the answers running there; every
# note ticks (defaults: guard.py keeps them from an answer): a window that ran alone and holds
# fewer notes than it saw ticks had its list emptied by the answer
_TICK, _OPENED = itertools.count().__next__, itertools.count().__next__
_NODE_LOCK = threading.Lock()
_MIXIN = torch.autograd.function._HookMixin
_REGISTER = _MIXIN.__dict__["_register_hook"]


def _reader_hook(hook, caller, depth=2):
    """Whether a hook is the reader's: registered from the reader's code, or its code (its
    function, a partial's, a closure's cell one or two levels in: torch's
    `register_multi_grad_hook` wraps the reader's function in its own) is the reader's."""
    if caller is not None and reader_code(caller.f_code):
        return True
    for _ in range(8):      # unwrapped by exact types: no attribute of the reader's object read
        if type(hook) is functools.partial:
            hook = hook.func
        elif type(hook) is types.MethodType:
            hook = hook.__func__
        elif type(hook) is not types.FunctionType:    # a callable object: its class's __call__
            hook = class_attribute(type(hook), "__call__")
    if type(hook) is not types.FunctionType:
        return False
    if reader_code(hook.__code__):          # a copy compiled under a library's name too (whose.py)
        return True
    cells = [c.cell_contents for c in hook.__closure__ or () if _filled(c)] if depth else ()
    return any(callable(v) and _reader_hook(v, None, depth - 1) for v in cells)


def _unguarded(hook):
    """A hook of the reader's not yet run as the answer is (settle.Guarded)."""
    return hook is not None and not issubclass(type(hook), Guarded) and _reader_hook(hook, None)


def _filled(cell):
    try:
        return cell.cell_contents is cell.cell_contents
    except ValueError:
        return False


def _note(hooks, key, *keys, _tick=_TICK, _NODES=_NODES):
    """A hook of the reader's registered (or a table given to a tensor: `key` _TABLE, `keys` what
    it held then): noted for the answers running in this thread (all of them when none does: a
    thread the answer started)."""
    with _NODE_LOCK:
        _tick()
        lists = _NODES["lists"].get(threading.get_ident()) or [
            lst for per in _NODES["lists"].values() for lst in per]
        for lst in lists:
            lst.append((hooks, key, *keys))


def _register_node_hook(hooks, hook):
    """Every hook on an autograd node (C++ nodes and custom Functions' alike) is registered
    through this static method: noted when it is the reader's (not torch's own: a module's full
    backward hooks put node hooks on each forward's output)."""
    hooks, handle = _REGISTER.__func__(hooks, hook)
    if _reader_hook(hook, sys._getframe(1)):
        _note(hooks, handle.id)
    return hooks, handle


# a tensor's gradient hooks: on any tensor, an intermediate one of the result's graph included
# (`mid.register_hook(h)` on a non-leaf goes to its node in C, past _HookMixin)
_TENSOR_REGISTER = types.MappingProxyType({
    name: torch.Tensor.__dict__[name]
    for name in ("register_hook", "register_post_accumulate_grad_hook")})


def _tensor_register(original):
    def register(self, hook):
        handle = original(self, hook)
        ref = getattr(handle, "hooks_dict_ref", None)
        hooks = ref() if callable(ref) else None
        if isinstance(hooks, dict) and _reader_hook(hook, sys._getframe(1)):
            _note(hooks, handle.id)
        return handle
    register.__name__, register.__doc__ = original.__name__, original.__doc__
    return register


_TENSOR_STAND_INS = types.MappingProxyType(
    {name: _tensor_register(f) for name, f in _TENSOR_REGISTER.items()})


# a tensor's hook tables themselves: every table given to a tensor while the answer runs (by
# torch's register_hook, an original of it bound before the check ran, or the reader's own code,
# `t._backward_hooks = {...}` then handed to its node by `_register_hook_dict`) is noted, and a
# hook of the reader's left in one is judged as a registered one
_TABLE_BASE = types.MappingProxyType({name: vars(torch._C.TensorBase)[name] for name in (
    "_backward_hooks", "_post_accumulate_grad_hooks") if name in vars(torch._C.TensorBase)})


def _table(name, base):
    def get(self):
        return base.__get__(self, type(self))

    def put(self, value):
        base.__set__(self, value)
        if issubclass(type(value), dict):
            _note(value, _TABLE, frozenset())

    def drop(self):
        base.__delete__(self)
    return property(get, put, drop, base.__doc__)


_TABLE = object()            # the key noted for a whole table: every hook in it then
_TABLES = types.MappingProxyType({name: _table(name, base) for name, base in _TABLE_BASE.items()})


def _install(on):
    if on:
        _MIXIN._register_hook = staticmethod(_register_node_hook)
        for attr, stand_in in {**_TENSOR_STAND_INS, **_TABLES}.items():
            setattr(torch.Tensor, attr, stand_in)
    else:
        _MIXIN._register_hook = _REGISTER
        for attr, original in _TENSOR_REGISTER.items():
            setattr(torch.Tensor, attr, original)
        for attr in _TABLES:
            delattr(torch.Tensor, attr)


def _left_hooks(mine):
    """(table, key) of the reader's hooks left registered: those noted, and those of the
    reader's added to a table noted whole."""
    left = []
    for hooks, key, *keys in mine:
        if key is _TABLE and not plain_keys(hooks):     # a key of the reader's class: taken
            _take_odd(hooks)                            # out unlooked-up, the answer failed
            left.append((hooks, _ODD))
        elif key is _TABLE:       # read by dict's own methods
            left += [(hooks, k) for k, v in list(dict.items(hooks))
                     if k not in keys[0] and _reader_hook(v, None, 0)]
        elif dict.__contains__(hooks, key):
            left.append((hooks, key))
    return list({(id(h), k): (h, k) for h, k in left}.values())


@contextlib.contextmanager
def node_hooks(name, guard=None, *, _tick=_TICK, _opened=_OPENED, _NODES=_NODES):
    """Fail an answer that returns with a hook it registered on an autograd node (a handed
    tensor's `grad_fn`, a node deeper in its graph, its result's) or on a tensor (any: an
    intermediate one of the result's graph too): the check's backward would run it. Its hooks
    are removed either way. `guard` (an exercise that keeps hooks): each is guarded in place,
    run as the answer is, instead."""
    mine, me = [], threading.get_ident()
    with _NODE_LOCK:
        if _NODES["depth"] == 0:
            _install(True)
        alone, opened, ticked = _NODES["depth"] == 0, _opened(), _tick()
        _NODES["depth"] += 1
        _NODES["lists"].setdefault(me, []).append(mine)
    returned = False
    try:
        yield
        returned = True
    finally:
        with _NODE_LOCK:
            alone = alone and _opened() == opened + 1
            emptied = alone and len(mine) < _tick() - ticked - 1
            lists = _NODES["lists"].get(me, [])
            lists[:] = [lst for lst in lists if lst is not mine]
            if not lists:
                _NODES["lists"].pop(me, None)
            _NODES["depth"] -= 1
            if _NODES["depth"] == 0:
                _install(False)
        left = _left_hooks(mine)
        for hooks, key in left:
            if guard is None:
                _table_kind(hooks).pop(hooks, key, None)
            elif returned and _unguarded(dict.get(hooks, key)):
                guard(hooks, key)
    if returned and emptied:
        raise CheckFailed(f"{name}: your code emptied the check's record of the hooks it "
                          "registers (hooks.py): an answer computes, it leaves the grader be")
    if returned and left and guard is None:
        raise CheckFailed(
            f"{name} returned with a hook still registered on a tensor or an autograd node "
            "(register_hook, register_post_accumulate_grad_hook, grad_fn.register_hook or "
            "register_prehook), on any tensor of its graph: it would run your code in the check's "
            "backward, after your function returned. Compute the result inside your function, "
            "and remove every hook you register (handle.remove()) before returning")


del _NODES
