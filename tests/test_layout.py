"""The package's façade: it re-exports, explicitly, what notebooks, scripts and the grader use
(and nothing else: tests import the rest from its home module), one name per thing, in the
order of its docstring's table; no name hides a module. The package's other rules:
test_package_rules.py, test_module_paths.py, test_one_home.py."""
import ast
import importlib
import inspect
import json
import pathlib
import re
import textwrap

import helpers

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "helpers"


def _modules():
    """Dotted names of helpers' modules (the checks excepted: helpers.checks is its own)."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "checks" or path.name == "__init__.py":
            continue
        yield "helpers." + ".".join(rel.with_suffix("").parts)


def _facade_imports():
    """{name: home module} of every name helpers/__init__.py imports from its modules."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    return {a.asname or a.name: "helpers." + n.module for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module for a in n.names}


def test_every_facade_name_is_its_modules_public_name():
    """Each module lists its public names in __all__; the façade re-exports some of them (the
    ones used outside helpers), each the very object of its home module."""
    for name in _modules():
        assert hasattr(importlib.import_module(name), "__all__"), \
            f"{name} lists its public names in __all__"
    wrong = [f"helpers.{attr} from {home}" for attr, home in _facade_imports().items()
             if attr not in importlib.import_module(home).__all__
             or getattr(helpers, attr) is not getattr(importlib.import_module(home), attr)]
    assert not wrong, f"not a public name of its module (add it to that __all__): {wrong}"


def test_every_module_of_the_checks_lists_its_public_names_too():
    """helpers/checks/ is its own package, but CONTRIBUTING's rule holds there as well: each
    module (an __init__ aside) assigns __all__ (read from its source)."""
    missing = [p.relative_to(ROOT).as_posix() for p in sorted((PKG / "checks").rglob("*.py"))
               if p.name != "__init__.py" and not any(
                   isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                     for t in n.targets)
                   for n in ast.parse(p.read_text()).body)]
    assert not missing, f"list the public names in __all__ in {missing}"


# --- what the façade holds: what book/, scripts/ and the grader use (not tests/) ---------------
_DOTTED = re.compile(r"\bhelpers\.([A-Za-z_]\w*)")


def _python_uses(src):
    """Names `src` takes from the façade: `from helpers import X`, `helpers.X`, `h.X` after
    `import helpers as h`."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    aliases, found = {"helpers"}, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            aliases |= {a.asname for a in n.names if a.name == "helpers" and a.asname}
        elif isinstance(n, ast.ImportFrom) and n.module == "helpers" and n.level == 0:
            found |= {a.name for a in n.names}
    return found | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id in aliases}


def _notebook_uses(text):
    """A notebook's uses. Not the names its code defines: a chapter's own copy of a function uses
    nothing (tests/test_notebook_sync.py finds the shipped one in its module)."""
    found = set()
    for cell in json.loads(text)["cells"]:
        src = "".join(cell["source"])
        found |= set(_DOTTED.findall(src))
        if cell["cell_type"] == "code":
            src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
            found |= _python_uses(src)
    return found


def _grader_uses(text):
    """The grader's: `from .. import X` (its only way into the façade) and the names its checks
    block with references=[...] (looked up in the façade)."""
    tree, found = ast.parse(text), set(_DOTTED.findall(text))
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module is None and n.level >= 2:
            found |= {a.name for a in n.names}
        if isinstance(n, ast.keyword) and n.arg == "references":
            found |= {e.value.split(".")[0] for e in ast.walk(n.value)
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return found


# the Python of shell scripts (test_module_paths.py reads it too)
_SH_PYTHON = (re.compile(r"<<-?'?(\w+)'?[^\n]*\n(.*?)\n\1\n", re.S),   # heredocs
              re.compile(r'-c "([^"$]*)"'))                              # python -c "..."


def _shell_python(text):
    """The Python a shell script runs: its heredocs and `-c "..."` snippets."""
    return [m.group(2) for m in _SH_PYTHON[0].finditer(text)] + _SH_PYTHON[1].findall(text)


def facade_uses(root=ROOT, grader=True):
    """Every façade name that book/, scripts/ (shell scripts' Python included) or
    helpers/checks/ use (prose included: a chapter that names `helpers.X` sends the reader
    there). Not tests/: a name only tests use stays in its module, and the tests import it from
    there. `grader=False`: the grader's uses left out, the teachers' guide's table of checks
    (generated from its REGISTRY) too."""
    found = set()
    for folder in ("book", "scripts"):
        for path in (root / folder).rglob("*"):
            if not path.is_file() or {"_build", "_vendor"} & set(path.parts):
                continue
            if path.suffix == ".ipynb":
                found |= _notebook_uses(path.read_text())
            elif path.suffix in (".py", ".md", ".sh"):
                text = path.read_text(errors="ignore")
                if not grader:
                    text = re.sub(r"<!-- checks-table: begin -->.*<!-- checks-table: end -->",
                                  "", text, flags=re.S)
                found |= set(_DOTTED.findall(text))
                found |= _python_uses(text) if path.suffix == ".py" else set()
                found |= set().union(*map(_python_uses, _shell_python(text))) \
                    if path.suffix == ".sh" else set()
    for path in (root / "helpers" / "checks").rglob("*.py") if grader else ():
        found |= _grader_uses(path.read_text())
    return found


def test_every_name_a_chapter_takes_from_helpers_exists():
    """helpers.X and `from helpers import X` in a chapter's code name something the package has
    (a façade name or a module): a name dropped from the façade breaks the chapter only when it
    runs (the Colab test checks the installed package too, much later in a run)."""
    import nbformat
    from book_files import helpers_names, toc_notebooks
    lacking = {}
    for path in toc_notebooks():
        for name in sorted(helpers_names(nbformat.read(path, as_version=4))):
            if not hasattr(helpers, name) and importlib.util.find_spec(f"helpers.{name}") is None:
                lacking.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert not lacking, f"chapters use names helpers lacks: {lacking}"


def test_the_facade_holds_only_what_is_used():
    """The façade is what notebooks, scripts and the grader use, and nothing else: a name
    nobody else uses (tests included) stays in its module (importable from there)."""
    unused = sorted(set(_facade_imports()) - facade_uses())
    assert not unused, (f"nothing uses helpers.{{{', '.join(unused)}}}: remove them from "
                        "helpers/__init__.py (they stay in their modules)")


def test_the_use_scan_sees_each_way_of_using_a_name(tmp_path):
    """Guard the guard: every way of reaching a façade name counts, and an unused one does not."""
    for folder in ("book/part9", "scripts", "tests", "helpers/checks"):
        (tmp_path / folder).mkdir(parents=True)
    cell = lambda kind, src: {"cell_type": kind, "source": [src], "metadata": {}}
    (tmp_path / "book/part9/x.ipynb").write_text(json.dumps({"cells": [
        cell("code", "%matplotlib inline\nimport helpers\nhelpers.a_dotted(1)\n"),
        cell("code", "def a_defined():\n    pass\n"),
        cell("markdown", "`helpers.a_in_prose` draws it"),
        cell("code", "from helpers import a_from\n")]}))
    (tmp_path / "scripts/s.py").write_text("import helpers as h\nh.an_alias()\n")
    (tmp_path / "scripts/r.sh").write_text("$PY - <<'EOF'\nfrom helpers import a_shell\nEOF\n")
    (tmp_path / "tests/t.py").write_text("from helpers import (a_test,\n    another)\n")
    (tmp_path / "helpers/checks/c.py").write_text(
        "from .. import a_grader\n@check('x', observes=[], references=['a_ref.method'])\n"
        "def c():\n    unused_name = 1\n")
    assert facade_uses(tmp_path) == {"a_dotted", "a_in_prose", "a_from", "an_alias", "a_shell",
                                     "a_grader", "a_ref"}   # tests and definitions do not count


# --- one name for one thing on the façade -----------------------------------------------------
def _forwarded(fn, facade):
    """What `fn` only hands its own parameters to, unchanged: a method of its own name
    (`def all_to_all(comm, x): return comm.all_to_all(x)`) or another façade function; None
    where it does anything else (adapts, checks, computes)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    if len(body) != 1 or not isinstance(body[0], ast.Return) \
            or not isinstance(call := body[0].value, ast.Call):
        return None
    params = {a.arg for a in (*tree.args.posonlyargs, *tree.args.args, *tree.args.kwonlyargs)}
    passed = [*call.args, *(k.value for k in call.keywords)]
    if not all(isinstance(a, ast.Name) and a.id in params for a in passed):
        return None
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == tree.name:
        return ast.unparse(f)
    if isinstance(f, ast.Name) and f.id != tree.name and f.id in facade:
        return f"helpers.{f.id}"
    return None


def facade_aliases(names, get):
    """Façade names that are another name's thing again: one object under two names, two names
    one underscore apart (ring_allreduce, ring_all_reduce), a function that only forwards."""
    found, seen, spelt = [], {}, {}
    for name in sorted(names):
        obj, bare = get(name), name.replace("_", "")
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) in seen:
            found.append(f"{name} is {seen[id(obj)]}")
        if bare in spelt:
            found.append(f"{name} and {spelt[bare]} differ by underscores")
        seen.setdefault(id(obj), name)
        spelt.setdefault(bare, name)
        if inspect.isfunction(obj) and (to := _forwarded(obj, names)):
            found.append(f"{name} only calls {to}")
    return found


def test_no_facade_name_is_another_under_a_second_name():
    """One name per thing: `helpers.all_to_all(comm, ...)` once only returned
    `comm.all_to_all(...)`, and ring_allreduce sat beside ring_all_reduce: two names for a reader
    to tell apart where there is one operation."""
    found = facade_aliases(set(_facade_imports()), lambda n: getattr(helpers, n))
    assert not found, f"keep one name of each on helpers/__init__.py: {found}"


def test_the_alias_scan_sees_each_kind_of_second_name(tmp_path, monkeypatch):
    """Guard the guard: a forwarding wrapper (a method of its name, another façade function), a
    second binding, a spelling underscores apart are found; what adapts its call is not."""
    (tmp_path / "alias_mod.py").write_text(
        "def all_to_all(comm, x, splits, tag=3):\n    '''Doc.'''\n"
        "    return comm.all_to_all(x, splits, tag=tag)\n\n"
        "def ring_all_reduce(xs, log=None):\n    return sum(xs)\n\n"
        "def total(xs, log):\n    return ring_all_reduce(xs, log=log)\n\n"
        "def ring_allreduce(xs):\n    return ring_all_reduce(list(xs))\n\n"
        "def scaled(xs):\n    return ring_all_reduce(xs) * 2\n\n"
        "def send(comm, x):\n    return comm.send(x, 0)\n\n"
        "again = scaled\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("alias_mod")
    names = {"all_to_all", "ring_all_reduce", "total", "ring_allreduce", "scaled", "send",
             "again"}
    assert sorted(facade_aliases(names, lambda n: getattr(mod, n))) == [
        "all_to_all only calls comm.all_to_all",
        "ring_allreduce and ring_all_reduce differ by underscores", "scaled is again",
        "total only calls helpers.ring_all_reduce"]


def _shadowed(pkg):
    """Submodules of the package `pkg` (and of its subpackages) whose name the package binds to
    something else: `import pkg.name as m` then hands back that thing, not the module."""
    import pkgutil
    found = []
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        if getattr(pkg, info.name) is not mod:
            found.append(f"{pkg.__name__}.{info.name}")
        if info.ispkg:
            found += _shadowed(mod)
    return found


def test_no_facade_name_hides_a_module():
    """helpers.dp_vs_ddp was once both a module and the function the façade exported, so
    `import helpers.dp_vs_ddp as m` returned the function: a name is one or the other."""
    hidden = _shadowed(helpers)
    assert not hidden, f"these modules are hidden by a name of their package: {hidden}; rename one"


def test_the_shadow_scan_sees_a_hidden_module(tmp_path, monkeypatch):
    pkg = tmp_path / "shadowed_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .step import step\nfrom .other import x\n")
    (pkg / "step.py").write_text("def step():\n    pass\n")
    (pkg / "other.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _shadowed(importlib.import_module("shadowed_pkg")) == ["shadowed_pkg.step"]


def test_the_facade_is_explicit():
    tree = ast.parse((PKG / "__init__.py").read_text())
    stars = [n.module for n in tree.body
             if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    assert not stars, f"star imports in helpers/__init__.py: {stars}; list the names"


# --- the façade's table -------------------------------------------------------------------------
def _facade_table():
    """[(home modules, names)] of the façade docstring's table, a row's continuation lines
    joined: the home column ends at column 28, the names begin at column 65."""
    lines = helpers.__doc__.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("home module"))
    rows = []
    for line in lines[top + 1:]:
        if not line.strip():
            break
        home, names = line[:28].strip(), line[65:]
        if home:
            rows.append((home, names))
        else:
            rows[-1] = (rows[-1][0], rows[-1][1] + " " + names)
    return [([h.strip() for h in home.split(",")],
             [n.strip() for n in names.split(",") if n.strip() not in ("", "...", "-")])
            for home, names in rows]


def test_the_facade_table_names_what_the_facade_exports_from_each_home():
    """Every name in the table's last column is helpers.X (helpers.checks.X in the checks row),
    imported by the façade from a module of its row (a reader following it finds it there)."""
    homes, wrong = _facade_imports(), []
    table = _facade_table()
    assert len(table) > 30 and any("runtime.launch" in h for h, _ in table)
    for patterns, names in table:
        for name in names:
            if patterns == ["checks"]:
                import helpers.checks
                ok = hasattr(helpers.checks, name)
            else:
                home = homes.get(name, "").removeprefix("helpers.")
                ok = any(_in_row(home, p) for p in patterns)
            if not ok:
                wrong.append(f"{name} ({', '.join(patterns)})")
    assert not wrong, f"the façade's table names what it does not export there: {wrong}"


def _in_row(home, pattern):
    """Whether a home module (without `helpers.`) is one a table row names: `ring`, every module
    of a package (`sharding.*`), or any module whose name ends so (`*schematics`)."""
    return (home == pattern or (pattern.endswith(".*") and home.startswith(pattern[:-1]))
            or (pattern.startswith("*") and home.endswith(pattern[1:])))


def test_the_facade_imports_each_module_once_in_the_tables_order():
    """One import line per home module, in the order of the table's rows (a module's row: the
    last that names it, so `*schematics` gathers the pictures after the splits), and every
    module the façade imports has a row: the table is the map of the import lines."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    modules = [n.module or n.names[0].name for n in tree.body
               if isinstance(n, ast.ImportFrom) and n.level == 1]
    repeated = sorted({m for m in modules if modules.count(m) > 1})
    assert not repeated, f"one import line per module in helpers/__init__.py: {repeated}"
    table = _facade_table()
    rows = {m: max((i for i, (patterns, _) in enumerate(table)
                    if any(_in_row(m, p) for p in patterns)), default=None) for m in modules}
    missing = [m for m, row in rows.items() if row is None]
    assert not missing, f"no row of the façade's table names {missing}"
    late = [f"{a} (row {rows[a]}) before {b} (row {rows[b]})"
            for a, b in zip(modules, modules[1:]) if rows[a] > rows[b]]
    assert not late, f"helpers/__init__.py imports out of the table's order: {late}"
