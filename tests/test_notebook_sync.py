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


def notebook_definitions(path):
    """(name, ast node) of every top-level def/class in the notebook's code cells."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
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


def shared_definitions():
    for path in toc_notebooks():
        for name, node in notebook_definitions(path):
            obj = getattr(helpers, name, None)
            if obj is not None and (inspect.isfunction(obj) or inspect.isclass(obj)):
                yield pytest.param(path, name, node, id=f"{path.relative_to(ROOT)}::{name}")


@pytest.mark.parametrize("path,name,node", list(shared_definitions()))
def test_notebook_code_matches_helpers(path, name, node):
    shipped = ast.parse(inspect.getsource(getattr(helpers, name))).body[0]
    assert _strip_docstrings(node) == _strip_docstrings(shipped), (
        f"{path.name} defines {name}() differently from helpers.{name}: keep them identical, "
        f"or give the notebook's draft another name")


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
