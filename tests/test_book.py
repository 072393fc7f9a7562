"""The book's table of contents and notebooks are consistent (no kernel needed)."""
import ast
import functools
import json
import re

import pytest
import yaml
from book_files import ROOT, book_sources, entry_path, toc_entries, toc_notebooks


def test_every_book_file_is_in_the_toc():
    listed = {entry_path(e) for e in toc_entries()}
    missing = [str(p.relative_to(ROOT)) for p in book_sources() if p not in listed]
    assert not missing, f"add these to _toc.yml, or the book never shows them: {missing}"


def test_every_toc_entry_exists():
    for entry in toc_entries():
        entry_path(entry)   # raises with the entry's name


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_metadata(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name", "python3") == "python3", \
        "both nbval and the book build run the python3 kernel"
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"cell {i} has a stored error output"


# ---------------------------------------------------------------- figures: alt text and captions
PLOT_ATTRS = {"imshow", "show", "savefig", "subplots", "figure", "bar", "barh", "scatter", "hist",
              "plot", "matshow"}
NOT_AXES = {"helpers", "torch", "nn", "dist", "np", "parallel", "comm"}


def _parse(source):
    code = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _calls(node, plotters, top_only):
    """Plotting calls under `node`: plt.*, plot*(...), Animator(...), ax.imshow/scatter/...(...),
    and calls of `plotters` (functions known to draw) unless given plot=False."""
    found = []
    if top_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                      ast.Lambda)):
        return found
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        off = any(k.arg == "plot" and isinstance(k.value, ast.Constant) and not k.value.value
                  for k in node.keywords)
        if (base == "plt" or name.startswith("plot") or name == "Animator"
                or (name in PLOT_ATTRS and base and base not in NOT_AXES)
                or (name in plotters and not off)):
            found.append(f"{base + '.' if base else ''}{name}")
    for child in ast.iter_child_nodes(node):
        found += _calls(child, plotters, top_only)
    return found


def _plotters(trees):
    """Names of the functions defined in `trees` whose bodies draw (they plot when called)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    any(_calls(s, set(), False) for s in node.body):
                names.add(node.name)
    return names


@functools.lru_cache(maxsize=1)
def helpers_plotters():
    modules = [p for p in (ROOT / "helpers").rglob("*.py") if "checks" not in p.parts]
    return frozenset(_plotters(_parse(p.read_text()) for p in modules))


def _plot_calls(source, plotters=frozenset()):
    """The plotting calls a cell makes at its top level (not inside a def or class). Empty for
    cells that only define functions."""
    tree = _parse(source)
    if tree is None:
        return []
    return [c for node in tree.body for c in _calls(node, plotters | helpers_plotters(), True)]


def figure_problems(path):
    """Plotting cells of a notebook without myst-nb alt text, caption or figure name."""
    nb = json.loads(path.read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    plotters = frozenset(_plotters(map(_parse, code)))
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        calls = _plot_calls("".join(cell["source"]), plotters)
        if not calls:
            continue
        meta = cell.get("metadata", {}).get("mystnb", {})
        missing = [k for k, v in (("image.alt", meta.get("image", {}).get("alt")),
                                  ("figure.caption", meta.get("figure", {}).get("caption")),
                                  ("figure.name", meta.get("figure", {}).get("name"))) if not v]
        name = meta.get("figure", {}).get("name") or ""
        if name and not name.startswith("fig-"):
            missing.append(f"figure.name {name!r} should start with 'fig-'")
        if missing:
            problems.append(f"cell {i} ({cell.get('id', '?')}, calls {calls[0]}): "
                            f"no mystnb {', '.join(missing)}")
    return problems


def test_plot_calls_are_found():
    assert _plot_calls("plt.plot(x)\n") == ["plt.plot"]
    assert _plot_calls("helpers.plot_costs(c)") == ["helpers.plot_costs"]
    assert _plot_calls("anim = Animator(xlabel='epoch')") == ["Animator"]
    assert _plot_calls("def plot_it(x):\n    plt.plot(x)\n") == [], "a def draws nothing"
    assert _plot_calls("helpers.show(helpers.train)") == [], "helpers.show prints source code"
    assert _plot_calls("x = 1\n%matplotlib inline") == []
    assert _plot_calls("nn.parallel.scatter(X, gpus)") == [], "not a plot"
    assert _plot_calls("r = helpers.train(1, 256, 0.1)") == ["helpers.train"], "train draws"
    assert _plot_calls("r = helpers.train(1, 256, 0.1, plot=False)") == []
    assert _plot_calls("r = train(2)", frozenset({"train"})) == ["train"]


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_has_alt_text_and_a_caption(path):
    """Every cell that draws a figure carries myst-nb metadata: alt text for screen readers, a
    caption and a book-unique `fig-...` name for {numref}:
    "mystnb": {"image": {"alt": "..."}, "figure": {"caption": "...", "name": "fig-..."}}"""
    problems = figure_problems(path)
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([A-Za-z_]\w*)")


def _glued_names(nb):
    return {out.get("metadata", {}).get("scrapbook", {}).get("name")
            for cell in nb["cells"] for out in cell.get("outputs", [])}


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_caption_glues_only_what_its_notebook_stores(path):
    """A caption may say what its figure shows from this run ({glue:text}`name`, which the book
    renders): the name must be glued in the notebook's stored outputs, or the build warns."""
    nb = json.loads(path.read_text())
    glued = _glued_names(nb)
    missing = [(cell.get("id"), name) for cell in nb["cells"]
               for name in GLUE_ROLE.findall(cell.get("metadata", {}).get("mystnb", {})
                                             .get("figure", {}).get("caption", ""))
               if name not in glued]
    assert not missing, f"{path.relative_to(ROOT)}: captions glue {missing}, stored nowhere"


def test_the_roofline_caption_says_whose_gpu_roofs_it_draws():
    """The GPU's roofs are measured (the GPU reference run) or the datasheet's (a prediction):
    the caption glues which, the sentence the prose uses."""
    nb = json.loads((ROOT / "book" / "gpus.ipynb").read_text())
    caption = next(c["metadata"]["mystnb"]["figure"]["caption"] for c in nb["cells"]
                   if c.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
                   == "fig-gpus-roofline")
    assert "{glue:text}`roof_gpu_source`" in caption and "roof_gpu_source" in _glued_names(nb)


def test_figure_names_are_unique():
    seen = {}
    for path in toc_notebooks():
        for cell in json.loads(path.read_text())["cells"]:
            name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
            if name:
                seen.setdefault(name, []).append(str(path.relative_to(ROOT)))
    dup = {n: ps for n, ps in seen.items() if len(ps) > 1}
    assert not dup, f"figure names used twice ({{numref}} needs unique ones): {dup}"


def test_vendored_files_match_their_recorded_hashes():
    """book/_vendor is what scripts/vendor-widgets.sh installed with `npm ci` (integrity-checked
    against scripts/vendor/package-lock.json): SOURCES.txt lists every file with its sha256."""
    import hashlib
    vendor = ROOT / "book" / "_vendor"
    listed = {}
    for line in (vendor / "SOURCES.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            listed[parts[1]] = parts[0]
    files = {str(p.relative_to(vendor)) for p in vendor.rglob("*")
             if p.is_file() and p.name != "SOURCES.txt"}
    assert files == set(listed), f"unlisted {files - set(listed)}, missing {set(listed) - files}"
    bad = [f for f in files if hashlib.sha256((vendor / f).read_bytes()).hexdigest() != listed[f]]
    assert not bad, f"changed by hand (rerun scripts/vendor-widgets.sh): {bad}"


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_glue_key_is_stored_once(path):
    """myst-nb warns "glue key ... duplicate" for a key glued twice in a notebook's outputs (a
    default glued, then glued again in a loop), and `-W` stops the book: glue each key once."""
    seen, twice = {}, []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            if name in seen:
                twice.append(f"{name} (cells {seen[name]} and {i})")
            seen[name] = i
    assert not twice, f"{path.relative_to(ROOT)} glues twice: {twice}"


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_labelled_figure_cell_shows_one_figure(path):
    """myst-nb gives a cell's figure label to each of its display outputs: a second one (an
    emptied progress line, a printed table shown as a display) duplicates the label and `-W`
    stops the book. Text streams beside the figure are fine, and so are glue records (myst-nb
    shows none: they only carry numbers to the prose)."""
    problems = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
        if cell["cell_type"] != "code" or not name or not cell.get("outputs"):
            continue
        shown = [o for o in cell["outputs"]
                 if o["output_type"] in ("display_data", "execute_result")
                 and not all(k.startswith("application/papermill.record/") for k in o["data"])]
        if len(shown) != 1 or not any(k.startswith("image/") for k in shown[0]["data"]):
            problems.append(f"cell {i} ({name}): {len(shown)} display outputs "
                            f"{[sorted(o['data']) for o in shown]}, want one image")
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def test_no_virtual_environment_is_read_as_book_pages():
    """Sphinx reads every page under the book's root that exclude_patterns does not name: a venv
    created in the repository (make's VENV and BOOK_VENV, a reader's venv/) would be published,
    its READMEs as pages. only_build_toc_files does not stop that."""
    import fnmatch
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    patterns = config["exclude_patterns"]
    make = (ROOT / "Makefile").read_text()
    venvs = re.findall(r"^(?:VENV|BOOK_VENV)\s*\?=\s*(\S+)", make, re.M)
    assert set(venvs) >= {".venv", ".venv-book"}, venvs
    for name in venvs + [".venv-3.12", "venv", ".venv_book"]:
        assert any(fnmatch.fnmatch(name, p) for p in patterns), \
            f"{name}/ is not excluded from the book by _config.yml's exclude_patterns {patterns}"


def test_ci_builds_the_pages_as_the_workflow_does():
    """The hosted Pages build is `make book-static`; `make test` (CI) must run that very target,
    so a build that fails only there (its own venv, no torch) fails CI first."""
    pages = yaml.safe_load((ROOT / ".github" / "workflows" / "pages.yml").read_text())
    runs = [s.get("run", "") for s in pages["jobs"]["build"]["steps"]]
    hosted = [r for r in runs if "book-static" in r]
    assert hosted and hosted[0].startswith("make book-static"), runs
    make = (ROOT / "Makefile").read_text()
    stages = re.search(r"^TEST_STAGES\s*:=(.*)$", make, re.M).group(1).split()
    assert {"test-book", "test-book-fresh"} <= set(stages), stages
    test = re.search(r"^test:\s*\n((?:\t.*\n)+)", make, re.M).group(1)
    assert "$(TEST_STAGES)" in test, test
    recipe = re.search(r"^test-book: .*\n((?:\t.*\n)+)", make, re.M).group(1)
    assert "book-static" in recipe, recipe


def _output_text(cell):
    """A code cell's stored text, as nbval compares it (streams and plain-text results)."""
    parts = []
    for out in cell.get("outputs", []):
        for text in (out.get("text", ""), out.get("data", {}).get("text/plain", "")):
            parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_checked_output_holds_no_rounding_noise(path):
    """nbval compares a cell tagged nbval-check-output with its stored output verbatim, so a
    float32 rounding gap printed there (7.5e-08 stored, 6.6e-08 in another run) fails a run
    that is right. Such a cell prints the bound (`< 1e-6`) or exact zeros; the prose beside it
    gives the run's own gap."""
    small = re.compile(r"\b\d\.\d+e-(\d+)\b")
    bad = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code" \
                or "nbval-check-output" not in cell["metadata"].get("tags", []):
            continue
        noise = [m.group(0) for m in small.finditer(_output_text(cell))
                 if int(m.group(1)) >= 4 and float(m.group(0)) != 0]
        if noise:
            bad.append(f"cell {i}: {noise[:3]}")
    assert not bad, f"{path.relative_to(ROOT)} checks rounding noise verbatim: {bad}"


def test_ci_runs_the_browser_and_waiting_modules_beside_test_py_once():
    """`make test` runs the browser test and the modules that mostly wait (BESIDE) in a stage of
    their own beside test-py, which leaves exactly those out under CI's order: a module named in
    one place only would run twice or never. Without CI's order test-py runs the waiting modules
    with the rest and leaves out only the browser test (test-browser runs it)."""
    import os
    import subprocess
    make = (ROOT / "Makefile").read_text()
    stages = re.search(r"^TEST_STAGES\s*:=(.*)$", make, re.M).group(1).split()
    assert "test-browser" not in stages, "the browser test would run twice"
    # what the browser test needs is built first
    needs = re.search(r"^test-beside:([^|\n]*)$", make, re.M).group(1).split()
    assert {"test-book", "node_modules/.installed", "chromium"} <= set(needs), needs
    assert stages.index("test-beside") > stages.index("test-pdf"), stages
    # under CI's order it waits for the second slot's other stages: started first, it delayed
    # test-py by the length of gpu-dry and the PDF
    order = re.search(r"^ifeq \(\$\(CI_ORDER\),1\)\n(.*?)^endif", make, re.M | re.S).group(1)
    after = re.search(r"^test-beside:\s*\|(.*)$", order, re.M).group(1).split()
    assert {"test-pdf", "gpu-dry"} <= set(after), after
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "CI_ORDER")}

    def recipe(target, *args):
        out = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed",
                              "-o", "test-book", "-o", "node_modules/.installed",
                              "-o", "chromium", target, *args], cwd=ROOT, capture_output=True,
                             text=True, env=env)
        assert out.returncode == 0, out.stderr
        command = out.stdout.replace("\\\n", " ")
        return next(line for line in command.splitlines() if "pytest" in line).split()
    beside = [w for w in recipe("test-beside", "CI_ORDER=1") if w.startswith("tests/")]
    left_out = [w.removeprefix("--ignore=") for w in recipe("test-py", "CI_ORDER=1")
                if w.startswith("--ignore=")]
    assert "tests/browser" in beside and len(beside) > 1, beside
    assert sorted(beside) == sorted(left_out), (beside, left_out)
    assert all((ROOT / w).exists() for w in beside), beside
    alone = [w for w in recipe("test-py") if w.startswith("--ignore=")]
    assert alone == ["--ignore=tests/browser"], alone


def test_every_unit_the_run_order_names_exists():
    """tests/conftest.py orders the units by SLOW_UNITS: a renamed module or notebook left there
    would silently drop back to the end of the run."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    table = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "SLOW_UNITS" for t in n.targets))
    assert table and not [u for u in table if not (ROOT / u).is_file()], table


def test_no_two_test_modules_share_a_name():
    """`make test` collects tests/ and tests/browser/ in one pytest run, where two test modules of
    one basename cannot both be imported ("import file mismatch")."""
    seen = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
