"""The shortcut FAMILIES of issue 32, one answer per way into each hole (tests/check_cases.py's
form): reading the check's state, the course's own answer under another name, work hidden in
another thread. Each must fail in the harness, for any exercise; none of them is specific to the
check it is tried on."""
import concurrent.futures
import gc
import importlib.util
import inspect
import pathlib
import sys
import threading
import types

import torch

import helpers
from check_cases import parametrize_cases, shortcut

HELPERS = pathlib.Path(helpers.__file__).resolve().parent
PEEK = "inspects the running program"
OWN = "course's own answer"


# ---- 1. reading the check: its frame, its traceback, the garbage collector ------------------
def _peek(name):
    """The nearest caller's local `name` (the check's expected value)."""
    f = sys._getframe(1)
    while f is not None:
        if name in f.f_locals:
            return f.f_locals[name]
        f = f.f_back
    return 0


def _peek_hidden(name):
    """The same walk, every name computed (nothing for a reader of the bytecode to see)."""
    f = getattr(sys, "_get" + "frame")(1)
    while f is not None:
        scope = getattr(f, "f_" + "locals")
        if name in scope:
            return scope[name]
        f = getattr(f, "f_" + "back")
    return 0


def _peek_traceback(name):
    try:
        raise RuntimeError
    except RuntimeError as e:
        tb = e.__traceback__
    f = getattr(tb, "tb_" + "frame")
    while f is not None:
        if name in f.f_locals:
            return f.f_locals[name]
        f = f.f_back
    return 0


@shortcut("check_tensor_bytes", "reads `want` in the check's frame", PEEK)
def tensor_bytes_peek(tensors):
    return _peek("want")


@shortcut("check_tensor_bytes", "frame walk with computed names", PEEK)
def tensor_bytes_peek_hidden(tensors):
    return _peek_hidden("want")


@shortcut("check_tensor_bytes", "frame from a traceback", PEEK)
def tensor_bytes_peek_traceback(tensors):
    return _peek_traceback("want")


@shortcut("check_tensor_bytes", "inspect.stack", PEEK)
def tensor_bytes_inspect(tensors):
    for info in inspect.stack():
        if "want" in info.frame.f_locals:
            return info.frame.f_locals["want"]
    return 0


@shortcut("check_tensor_bytes", "the garbage collector finds the check's list", PEEK)
def tensor_bytes_gc(tensors):
    for holder in gc.get_referrers(tensors[0]):
        if isinstance(holder, list) and holder is not tensors:
            return sum(t.numel() * t.element_size() for t in holder)
    return 0


@shortcut("check_tensor_bytes", "frames of another thread", PEEK)
def tensor_bytes_current_frames(tensors):
    for f in getattr(sys, "_current_" + "frames")().values():
        while f is not None:
            if "want" in f.f_locals:
                return f.f_locals["want"]
            f = f.f_back
    return 0


@shortcut("check_saved_bytes", "reads `want` in the check's frame", PEEK)
def saved_bytes_peek(net, X):
    return _peek_hidden("want")


# ---- 2. the course's own answer under another name ---------------------------------------------
def _renamed(fn, name):
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _exec_copy(fn):
    scope = dict(fn.__globals__)
    exec(compile(inspect.getsource(fn), "<my cell>", "exec"), scope)
    return scope[fn.__name__]


def _other_import(name):
    """The course imported again under another package name (as fresh.py does)."""
    spec = importlib.util.spec_from_file_location(
        name, HELPERS / "__init__.py", submodule_search_locations=[str(HELPERS)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
    return package


MY_CUTS = _renamed(helpers.balanced_cuts, "my_cuts")
EXEC_SAVED = _exec_copy(helpers.saved_per_layer)
OTHER = _other_import("my_course_copy")


@shortcut("check_split_by_params", "balanced_cuts renamed with CodeType.replace", OWN)
def split_by_params_renamed(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    return helpers.split_sequential(net, MY_CUTS(sizes, len(devices)), devices)


@shortcut("check_saved_bytes", "saved_per_layer rebuilt from its source", OWN)
def saved_bytes_exec(net, X):
    return sum(EXEC_SAVED(net, X))


@shortcut("check_saved_bytes", "saved_per_layer of the course imported again", OWN)
def saved_bytes_other_import(net, X):
    return sum(OTHER.saved_per_layer(net, X))


@shortcut("check_saved_bytes", "exec'd copy made while the answer runs", OWN)
def saved_bytes_exec_inside(net, X):
    scope = {}
    source = (HELPERS / "costs.py").read_text()
    exec(compile(source, "<cell>", "exec"), scope)
    return sum(scope["saved_per_" + "layer"](net, X))


@shortcut("check_saved_bytes", "course imported again while the answer runs", OWN)
def saved_bytes_import_inside(net, X):
    return sum(getattr(_other_import("my_copy_inside"), "saved_per_" + "layer")(net, X))


# twins: other course functions that compute the same answer
@shortcut("check_saved_bytes", "twin: autograd_saved_bytes (review)", OWN)
def saved_bytes_twin(net, X):
    return helpers.autograd_saved_bytes(lambda: net(X), list(net.parameters()))[0]


@shortcut("check_saved_bytes", "twin: saved_activation_bytes (review)", OWN)
def saved_bytes_twin_tp(net, X):
    return helpers.saved_activation_bytes(net, X, params=list(net.parameters()))[1]


@shortcut("check_order_1f1b", "twin: one_f_one_b_rank_order (review)", OWN)
def order_1f1b_twin(p, m):
    return [helpers.one_f_one_b_rank_order(p, m, s) for s in range(p)]


@shortcut("check_allreduce_spread", "twin: ring_allreduce (review)", OWN)
def allreduce_spread_twin(data):
    helpers.ring_allreduce(data)


@shortcut("check_reduce_then_broadcast", "twin: allreduce (review)", OWN)
def reduce_then_broadcast_twin(grads):
    helpers.allreduce(grads)


@shortcut("check_global_mean_var", "the course's _combine_stats (review K7)", OWN)
def global_mean_var_twin(*args, **kwargs):
    from helpers.data_parallel.torch_api import _combine_stats
    return _combine_stats(*args, **kwargs)


# ---- 4. work in another thread ----------------------------------------------------------------
@shortcut("check_shard_sizes", "torch.tensor_split in a worker thread", "split")
def shard_sizes_in_thread(n, k):
    out = []
    worker = threading.Thread(
        target=lambda: out.extend(len(s) for s in torch.arange(n).tensor_split(k)))
    worker.start()
    worker.join()
    return out


@shortcut("check_shard_sizes", "torch.tensor_split in a thread pool", "split")
def shard_sizes_in_pool(n, k):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: [len(s) for s in torch.arange(n).tensor_split(k)]).result()


test_case = parametrize_cases(__name__)
