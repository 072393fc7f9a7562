"""What `helpers.checks` exports: every check a notebook calls, imported by name from the module
named after that notebook, and nothing else by accident (no star import anywhere in helpers)."""
import ast
import importlib
import inspect
import json
import types

from book_files import ROOT

import helpers.checks

CHECKS = ROOT / "helpers" / "checks"
# the harness's face: what a check is built with (check, expect, fresh_generator) and what a
# grader reads (run_check, Result, REGISTRY, CheckFailed, HarnessError)
HARNESS = {"REGISTRY", "CheckFailed", "HarnessError", "Result", "check", "expect",
           "fresh_generator", "run_check"}


def code_of(path):
    """A notebook's code cells as one parsable module (magics and shell lines dropped)."""
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            lines += [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
            lines.append("")
    return ast.parse("\n".join(lines))


def checks_used(path):
    """The names a notebook takes from helpers.checks: `from helpers.checks import X` and
    `checks.X` / `helpers.checks.X`."""
    found = set()
    for node in ast.walk(code_of(path)):
        if isinstance(node, ast.ImportFrom) and node.module == "helpers.checks":
            found |= {a.name for a in node.names}
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute))
              and ast.unparse(node.value) in ("checks", "helpers.checks")):
            found.add(node.attr)
    return found


NOTEBOOKS = sorted(p for p in (ROOT / "book").rglob("*.ipynb")
                   if not set(p.parts) & {"_build", ".ipynb_checkpoints"})
USED = {p: checks_used(p) for p in NOTEBOOKS}
CHAPTER_MODULES = sorted(p.stem for p in CHECKS.glob("[a-z]*.py"))


def test_every_check_a_notebook_calls_is_exported():
    missing = sorted(f"{name} ({p.relative_to(ROOT)})" for p, names in USED.items()
                     for name in names if name not in helpers.checks.__all__)
    assert not missing, f"notebooks take names helpers.checks does not export: {missing}"


def test_the_checks_exported_are_the_checks_notebooks_call():
    called = set().union(*USED.values())
    extra = sorted(n for n in helpers.checks.__all__ if n not in HARNESS and n not in called)
    assert not extra, f"helpers.checks exports checks no notebook calls: {extra}"


def test_nothing_else_is_exported_by_accident():
    public = {n for n, v in vars(helpers.checks).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(helpers.checks.__all__), (
        f"public names not in __all__: {sorted(public - set(helpers.checks.__all__))}; "
        f"in __all__ but missing: {sorted(set(helpers.checks.__all__) - public)}")
    listed = set(HARNESS)
    for name in CHAPTER_MODULES:
        listed |= set(importlib.import_module(f"helpers.checks.{name}").__all__)
    assert set(helpers.checks.__all__) == listed


def test_a_check_module_is_named_after_its_notebook_and_holds_its_checks():
    by_stem = {p.stem: p for p in NOTEBOOKS}
    for name in CHAPTER_MODULES:
        assert name in by_stem, f"helpers/checks/{name}.py is named after no notebook in book/"
        module = importlib.import_module(f"helpers.checks.{name}")
        for check in module.__all__:
            assert getattr(module, check).__module__ == module.__name__, (
                f"{name}.__all__ lists {check}, defined in another module")
            assert check in USED[by_stem[name]], (
                f"{check} (helpers/checks/{name}.py) is not called in {by_stem[name].name}")


def test_the_module_checks_have_a_notebook_each():
    # the other direction: a chapter's checks all live in the module named after it
    where = {c: n for n in CHAPTER_MODULES
             for c in importlib.import_module(f"helpers.checks.{n}").__all__}
    for path, names in USED.items():
        for name in names - HARNESS:
            assert where.get(name) == path.stem, (
                f"{path.relative_to(ROOT)} calls {name}, which lives in "
                f"helpers/checks/{where.get(name)}.py, not {path.stem}.py")


def test_no_star_import_in_helpers():
    stars = [f"{p.relative_to(ROOT)}:{node.lineno}"
             for p in (ROOT / "helpers").rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)]
    assert not stars, f"star imports (name what you import): {stars}"


def test_the_grader_imports_only_the_facade_and_runtime():
    """Someone working on a split can ignore helpers/checks: it reaches the course through the
    façade (`from .. import name`) and helpers.runtime only."""
    bad = []
    for p in CHECKS.rglob("*.py"):
        package = ["helpers", *p.relative_to(ROOT / "helpers").parent.parts]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
            elif isinstance(node, ast.Import):
                target = next((a.name for a in node.names if a.name.startswith("helpers")), "")
            else:
                continue
            if target.startswith("helpers") and not (
                    target in ("helpers", "helpers.runtime") or
                    target.startswith(("helpers.checks", "helpers.runtime."))):
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno} imports {target}")
            elif target == "helpers" and isinstance(node, ast.ImportFrom):
                # `from .. import sharding` reaches a split's module through the façade
                import helpers
                for alias in node.names:
                    if inspect.ismodule(getattr(helpers, alias.name, None)):
                        bad.append(f"{p.relative_to(ROOT)}:{node.lineno} imports the module "
                                   f"helpers.{alias.name}")
    assert not bad, f"import these through the façade (from .. import name): {bad}"
