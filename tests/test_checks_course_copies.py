"""The course's own answer under another name, tried on any exercise (tests/check_cases.py's
form): a course function renamed with CodeType.replace, rebuilt from its source, taken from the
course imported again under another package name (at import or while the answer runs), and the
course's twins of an answer. Each must fail in the harness."""
import importlib.util
import inspect
import pathlib
import sys
import types

from check_cases import parametrize_cases, shortcut

import helpers

HELPERS = pathlib.Path(helpers.__file__).resolve().parent
OWN = "course's own answer"


# ---- the course's own answer under another name --------------------------------------------------
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


@shortcut("check_split_by_params", "balanced_cuts renamed with CodeType.replace",
          [OWN, "balanced_cuts"])
def split_by_params_renamed(net, devices):
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    bounds = [0, *MY_CUTS(sizes, len(devices)), len(net)]     # no split_sequential: the cuts
    return [net[a:b].to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


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
@shortcut("check_saved_bytes", "twin: saved_bytes", OWN)
def saved_bytes_twin(net, X):
    return helpers.saved_tensor_bytes(net, X)[0]


@shortcut("check_saved_bytes", "twin: saved_bytes of a lambda, parameters passed", OWN)
def saved_bytes_twin_lambda(net, X):
    return helpers.saved_tensor_bytes(lambda: net(X), params=list(net.parameters()))[0]


@shortcut("check_order_1f1b", "twin: one_f_one_b_rank_order", OWN)
def order_1f1b_twin(p, m):
    return [helpers.one_f_one_b_rank_order(p, m, s) for s in range(p)]


@shortcut("check_allreduce_spread", "twin: ring_allreduce", OWN)
def allreduce_spread_twin(data):
    helpers.ring_allreduce(data)


@shortcut("check_reduce_then_broadcast", "twin: allreduce", OWN)
def reduce_then_broadcast_twin(grads):
    helpers.allreduce(grads)


@shortcut("check_global_mean_var", "the course's combine_stats", OWN)
def global_mean_var_twin(*args, **kwargs):
    return helpers.combine_stats(*args, **kwargs)


test_case = parametrize_cases(__name__)
