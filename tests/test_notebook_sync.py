"""The code a notebook builds is the code `helpers` ships.

Every top-level function or class a notebook defines under the name of a `helpers` export must be
the same code (docstrings and comments aside). Drafts and deliberately buggy variants in the
notebooks use other names (e.g. `allreduce_rebinding`).
"""
import ast
import inspect
import json

import pytest
from book_files import ROOT, toc_notebooks

import helpers


def _strip_docstrings(node):
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) \
                    and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                n.body = n.body[1:] or [ast.Pass()]
    return ast.dump(node, include_attributes=False)


def notebook_definitions(path, answers=True):
    """(name, ast node) of every top-level def/class in the notebook's code cells (answers=False:
    not in an exercise's answer, a cell tagged `solution`)."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or not answers and \
                "solution" in cell.get("metadata", {}).get("tags", ()):
            continue
        src = "".join(cell["source"])
        src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                yield node.name, node


def _public_names():
    """{name: object} of what helpers' modules list in __all__ (the grader's aside): a chapter
    may build a function the façade does not re-export (no chapter calls it from helpers)."""
    import importlib
    import pkgutil
    found = {}
    for info in pkgutil.walk_packages(helpers.__path__, "helpers."):
        if info.name.startswith("helpers.checks"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found.setdefault(name, obj)
    return found


SHIPPED = _public_names()


def shipped(name, facade_only=False):
    """The helpers function or class named `name`: the façade's, else its module's."""
    obj = getattr(helpers, name, None)
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return obj
    return None if facade_only else SHIPPED.get(name)


def shared_definitions():
    """A chapter's copies of the façade's functions, and of its modules' (but for an exercise's
    answer: the reader's own function, whatever a module names its helper)."""
    for path in toc_notebooks():
        copies = {name for name, _ in notebook_definitions(path, answers=False)}
        for name, node in notebook_definitions(path):
            if shipped(name, facade_only=name not in copies) is not None:
                yield pytest.param(path, name, node, id=f"{path.relative_to(ROOT)}::{name}")


@pytest.mark.parametrize("path,name,node", list(shared_definitions()))
def test_notebook_code_matches_helpers(path, name, node):
    shipped_node = ast.parse(inspect.getsource(shipped(name))).body[0]
    assert _strip_docstrings(node) == _strip_docstrings(shipped_node), (
        f"{path.name} defines {name}() differently from {shipped(name).__module__}.{name}: "
        f"keep them identical, or give the notebook's draft another name")


def test_sync_compares_copies_the_facade_does_not_export():
    """Guard the guard: a chapter's copy of a function that is no façade name (it stays in its
    module: no chapter calls it from helpers) is still compared with the shipped one."""
    compared = {p.values[1] for p in shared_definitions()}
    beyond = {name for name in compared if not hasattr(helpers, name)}
    assert {"stage_forward", "CopyToTP", "time_matmul"} <= beyond, sorted(beyond)


def test_sync_covers_part_two():
    """Guard the guard: Part II must define its functions in the notebook and be compared."""
    names = {name for p in toc_notebooks() if p.name == "scratch.ipynb"
             for name, _ in notebook_definitions(p)}
    required = {"lenet", "get_params", "allreduce", "split_batch", "train_batch", "train"}
    assert required <= names, f"scratch.ipynb no longer defines {sorted(required - names)}"


def _assigned_literals(path, names):
    """{name: value} of the notebook's top-level `name = ...` assignments to `names` (literals and
    `dict(...)` of literals)."""
    nb = json.loads(path.read_text())
    found = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and getattr(node.targets[0], "id", None) in names:
                value = compile(ast.Expression(node.value), str(path), "eval")
                found[node.targets[0].id] = eval(value, {"__builtins__": {}, "dict": dict})
    return found


def test_scaling_assumptions_are_what_helpers_ships():
    """Other chapters (fixes' bucket exercise) read the scaling chapter's assumed links and
    backward from helpers: the values the scaling chapter spells out must be those."""
    path = next(p for p in toc_notebooks() if p.name == "scaling.ipynb")
    found = _assigned_literals(path, {"assumed", "backward_s"})
    assert found == {"assumed": helpers.ASSUMED_LINKS,
                     "backward_s": helpers.ASSUMED_BACKWARD_S}, found


def test_the_gpu_chapters_timer_product_is_the_one_the_reference_run_times():
    """The GPU reference run times the GPU chapter's timer lesson with helpers.devices'
    time_matmul at GPU_TIMER_WORK (gpu_chapter_figures); the chapter quotes those readings as its
    own product's: its `gpu_work` must be that size."""
    from helpers.devices import GPU_TIMER_WORK
    path = next(p for p in toc_notebooks() if p.name == "gpus.ipynb")
    assert _assigned_literals(path, {"gpu_work"}) == {"gpu_work": GPU_TIMER_WORK}
    assert "time_matmul" in {name for name, _ in notebook_definitions(path)}, \
        "the chapter defines time_matmul, compared with the shipped one above"
