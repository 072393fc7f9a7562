"""helpers/checks/README.md tells someone working on a split what ties it to the grader, and
stays true: its two tables (the names the checks compute with, with the tests of their right
answers; the façade names only the grader uses) are generated here, and
`python tests/test_checks_readme.py` rewrites them; every name of helpers.runtime the harness
imports, and every ThreadWorld method its World overrides, is named in it."""
import ast
import importlib
import re
import sys

from book_files import ROOT

CHECKS = ROOT / "helpers" / "checks"
README = CHECKS / "README.md"
GUARANTEES = CHECKS / "_core" / "README.md"
BLOCKS = {"fixtures": ("<!-- fixtures: begin -->", "<!-- fixtures: end -->"),
          "grader-only": ("<!-- grader-only: begin -->", "<!-- grader-only: end -->")}


def _course_imports(path):
    """What a module of the grader takes from the course: `from .. import X` gives "X";
    `from ..runtime import m` gives "runtime.m.attr" for each `m.attr` it reads (or
    "runtime.m"); `from ...runtime.m import y` gives "runtime.m.y"."""
    tree = ast.parse(path.read_text())
    package = len(path.relative_to(CHECKS).parts) + 1   # dots up to helpers: 2 in checks/
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != package:
            continue
        if node.module is None:
            found |= {a.name for a in node.names}
        elif node.module == "runtime":
            for a in node.names:
                bound = a.asname or a.name
                read = {f"runtime.{a.name}.{n.attr}" for n in ast.walk(tree)
                        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                        and n.value.id == bound}
                found |= read or {f"runtime.{a.name}"}
        elif node.module.startswith("runtime."):
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _right_answer_tests():
    """{check: the test modules that register its worked or other right answers}."""
    tests = ROOT / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    from check_cases import CASES
    for path in sorted(tests.glob("test_checks_*.py")):
        importlib.import_module(path.stem)              # each registers its cases
    return {check: {c.module for c in cases["worked"] + cases["others"]}
            for check, cases in CASES.items()}


def fixtures_table():
    """Per check module that computes with course code: what it takes, and the tests to run."""
    tests = _right_answer_tests()
    rows = ["| check module | computes its expected values with | run these tests after "
            "changing one |", "| --- | --- | --- |"]
    for path in sorted(CHECKS.glob("[a-z]*.py")):
        taken = _course_imports(path)
        if not taken:
            continue
        checks = importlib.import_module(f"helpers.checks.{path.stem}").__all__
        modules = sorted(set().union(*(tests.get(c, set()) for c in checks)))
        rows.append(f"| `{path.name}` | {', '.join(f'`{n}`' for n in sorted(taken))} | "
                    f"{', '.join(f'`{m}.py`' for m in modules)} |")
    return "\n".join(rows)


def grader_only_table():
    """The façade names that nothing but the grader uses, and what the grader does with each."""
    from test_layout import _DOTTED, _facade_imports, facade_uses

    from helpers.checks._core import REGISTRY
    why = {}
    for path in sorted(CHECKS.rglob("*.py")):
        rel = path.relative_to(CHECKS).as_posix()
        for name in _course_imports(path):
            why.setdefault(name, []).append(f"`{rel}` computes with it")
        for name in set(_DOTTED.findall(path.read_text())):
            why.setdefault(name, []).append(f"`{rel}` names it")
    for check, info in sorted(REGISTRY.items()):
        for name in {r.split(".")[0] for r in info.references if not r.startswith("torch.")}:
            why.setdefault(name, []).append(f"`{check}` refuses it (references=)")
    alone = sorted((set(_facade_imports()) & set(why)) - facade_uses(grader=False))
    rows = ["| façade name | the grader's use |", "| --- | --- |"]
    rows += [f"| `{name}` | {'; '.join(why[name])} |" for name in alone]
    return "\n".join(rows)


def _block(text, name):
    begin, end = BLOCKS[name]
    assert begin in text and end in text, f"{README.name} lacks the {begin} ... {end} markers"
    return text[text.index(begin) + len(begin):text.index(end)].strip()


def _rewritten(text):
    for name, table in (("fixtures", fixtures_table()), ("grader-only", grader_only_table())):
        begin, end = BLOCKS[name]
        text = text[:text.index(begin) + len(begin)] + f"\n{table}\n" + text[text.index(end):]
    return text


def _stale(name, table):
    """What the README's table `name` lacks and holds beyond `table`, and how to rewrite it."""
    have, want = set(_block(README.read_text(), name).splitlines()), set(table.splitlines())
    return (f"helpers/checks/README.md's {name} table is stale (lacks {sorted(want - have)}, "
            f"holds besides {sorted(have - want)}): run `python tests/test_checks_readme.py` "
            "to rewrite it")


def test_the_readme_lists_what_the_checks_compute_with():
    """Every façade and runtime name a check module imports is listed, nothing else is, and so
    is every test module with a right answer of that module's checks: a change in what such a
    function does changes the verdicts, which only those right answers catch."""
    table = fixtures_table()
    assert _block(README.read_text(), "fixtures") == table, _stale("fixtures", table)


def test_the_readme_lists_the_facade_names_only_the_grader_uses():
    """A split cannot drop these from the façade (tests/test_layout.py counts the grader's use):
    the README says which they are and why they stay."""
    table = grader_only_table()
    assert _block(README.read_text(), "grader-only") == table, _stale("grader-only", table)


def test_the_readme_names_what_the_harness_takes_from_the_course():
    """A change to these is a change to the checks: what the harness's own modules (_core/ and
    the private ones beside the checks) import from helpers.runtime (or the façade), and the
    ThreadWorld methods its World overrides (each a hook the runtime must keep calling), are
    each named in the README."""
    from helpers.checks._core.world import World
    from helpers.runtime.thread_world import ThreadWorld
    named = set(re.findall(r"`([^`]+)`", README.read_text()))
    missing = []
    for path in sorted(CHECKS.rglob("_*/*.py")) + sorted(CHECKS.glob("_*.py")):
        for dotted in _course_imports(path):
            if dotted.startswith("runtime."):
                module, _, name = dotted.removeprefix("runtime.").partition(".")
                seen = f"runtime/{module}.py" in named and name in named
            else:
                seen = dotted in named
            if not seen:
                missing.append(f"{dotted} ({path.relative_to(CHECKS)})")
    inherited = {n for c in ThreadWorld.__mro__[:-1] for n in vars(c)} - {"__doc__", "__module__"}
    missing += [f"World.{n}" for n in sorted(set(vars(World)) & inherited) if n not in named]
    assert not missing, f"helpers/checks/README.md does not name {missing}"


def test_the_guarantees_have_their_own_page():
    """The README links the table of what each part of the harness guarantees, whose rows each
    name a module of _core that exists."""
    assert "(_core/README.md)" in README.read_text()
    rows = re.findall(r"^\| `([\w.]+)` \|", GUARANTEES.read_text(), re.M)
    assert len(rows) >= 40, rows
    gone = [r for r in rows if not (CHECKS / "_core" / r).is_file()]
    assert not gone, f"helpers/checks/_core/README.md has rows for no module: {gone}"


if __name__ == "__main__":
    README.write_text(_rewritten(README.read_text()))
    print(f"{README.relative_to(ROOT)}: tables rewritten")
