"""The grader observes answers from below torch's public API: it names private torch attributes
(`torch._C._DisableTorchDispatch`, `torch.utils._python_dispatch._pop_mode`, ...) that a torch
release may rename without notice. torch has no upper bound (pyproject.toml says why); a weekly
workflow runs the tests on the newest torch, and this test lists every private name the grader's
code reaches (read from its source) and fails, naming each missing one and the torch installed,
so that a new torch shows the breakage here at once rather than as "the check itself failed" in
every reader's exercise."""
import ast
import importlib
import pathlib
import re
import tomllib

import torch
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
GRADER = ROOT / "helpers" / "checks"


def _private(dotted):
    """Whether a dotted torch path passes through a private name (`_x`, not a dunder)."""
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def _chain(node):
    """`a.b.c` of an Attribute/Name chain, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


_DOTTED = re.compile(r"torch(\.\w+)+")


def private_names(source):
    """The private torch paths `source` reaches: `from torch.x._y import z` (torch.x._y.z),
    `import torch._x`, attribute chains `torch._C._nn.f` (through the names that modules are
    imported as: `import torch.distributed as dist` makes `dist._x` torch.distributed._x), a
    name looked up by its string (`getattr(torch.autograd, "_x")`, or the pair
    `(torch.autograd, "_x")`), and a check's `references=["torch._x.f"]` (the harness looks
    each up; a module-level string prefix added to it counts).
    `getattr(torch._C, "_x", None)` is optional (the grader copes without it): not listed."""
    tree = ast.parse(source)
    alias, found = {"torch": "torch"}, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "torch":
                    alias[a.asname or "torch"] = a.name if a.asname else "torch"
                    found |= {a.name} if _private(a.name) else set()
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module \
                and n.module.split(".")[0] == "torch":
            for a in n.names:
                alias[a.asname or a.name] = f"{n.module}.{a.name}"
                found |= {f"{n.module}.{a.name}"} if _private(f"{n.module}.{a.name}") else set()
    consts = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}

    def string_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return consts.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = string_of(node.left), string_of(node.right)
            return left + right if left is not None and right is not None else None
        return None

    def torch_path(node):
        dotted = _chain(node)
        head = dotted and dotted.split(".")[0]
        return alias[head] + dotted[len(head):] if head in alias else None

    for n in ast.walk(tree):
        pair = (n.args if isinstance(n, ast.Call) and _chain(n.func) == "getattr"
                and len(n.args) == 2 and not n.keywords else
                n.elts[:2] if isinstance(n, ast.Tuple) else [])
        if len(pair) == 2 and isinstance(pair[1], ast.Constant) \
                and isinstance(pair[1].value, str) and pair[1].value.startswith("_") \
                and torch_path(pair[0]):
            found.add(f"{torch_path(pair[0])}.{pair[1].value}")
        if isinstance(n, ast.keyword) and n.arg == "references" \
                and isinstance(n.value, (ast.List, ast.Tuple)):
            found |= {v for v in map(string_of, n.value.elts)
                      if v and _DOTTED.fullmatch(v) and _private(v)}
    outer = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and id(n) not in outer:   # the longest chain only
            full = torch_path(n)
            found |= {full} if full and _private(full) else set()
    return found


def resolves(dotted):
    """Whether torch has `dotted`: attribute by attribute, importing a submodule not yet
    imported (torch._subclasses.fake_tensor)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return False
    return True


def grader_privates():
    """{private torch path: the grader's files that reach it}."""
    out = {}
    for path in sorted(GRADER.rglob("*.py")):
        for name in private_names(path.read_text()):
            out.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return out


def test_the_scan_finds_the_graders_private_torch_names():
    """The scan still sees the grader's known dependencies (a scan that found nothing would
    pass on any torch)."""
    found = grader_privates()
    assert len(found) >= 20, sorted(found)
    assert {"torch._C._DisableTorchDispatch", "torch.utils._python_dispatch.TorchDispatchMode",
            "torch._subclasses.fake_tensor.FakeTensorMode", "torch.autograd._engine_run_backward",
            "torch.distributed.utils._replace_by_prefix"} <= set(found), sorted(found)


def test_the_installed_torch_has_every_private_name_the_grader_reaches():
    missing = {name: files for name, files in grader_privates().items() if not resolves(name)}
    assert not missing, (
        f"torch {torch.__version__} lacks private names the exercise checks use: "
        + "; ".join(f"{n} (in {', '.join(f)})" for n, f in sorted(missing.items()))
        + ". Adapt the grader to this torch (the weekly newest-torch job runs this)")


def test_a_missing_private_name_is_reported():
    """Guard the guard: a renamed private name is found and does not resolve."""
    src = ("import torch\nimport torch.distributed as dist\n"
           "from torch.utils._python_dispatch import _no_such_mode\n"
           "x = torch._C._no_such_hook(1)\ndist._no_such_group\ntorch.nn.functional.relu\n"
           "getattr(torch.autograd, '_no_such_route')\ngetattr(torch._C, '_optional', None)\n"
           "ROUTE = [(torch.autograd.graph, '_no_such_engine', 1)]\n"
           "PRE = 'torch._no_such_pkg.'\nMODULES = ('torch._custom_op',)   # a prefix to match\n"
           "@check('x', references=['torch.distributed.utils._no_such_helper', PRE + '_f',\n"
           "                        'torch.nn.functional.relu', 'a_course_name'])\n"
           "def check_x(fn):\n    pass\n")
    assert private_names(src) == {
        "torch.utils._python_dispatch._no_such_mode", "torch._C._no_such_hook",
        "torch._C", "torch.distributed._no_such_group", "torch.autograd._no_such_route",
        "torch.autograd.graph._no_such_engine", "torch.distributed.utils._no_such_helper",
        "torch._no_such_pkg._f"}
    assert not any(resolves(n) for n in private_names(src) if "_no_such" in n)
    assert resolves("torch._C._DisableTorchDispatch") and resolves("torch._subclasses.fake_tensor")


def test_a_weekly_job_runs_the_grader_on_the_newest_torch():
    """pyproject.toml leaves torch uncapped: the weekly job is what shows a new release breaking
    the grader (this file first), before readers meet it."""
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "newest-torch.yml").read_text())
    assert "schedule" in wf[True], "newest-torch.yml must run on a schedule"
    (job,) = wf["jobs"].values()
    run = " ".join(step.get("run", "") for step in job["steps"])
    assert "TORCH=cpu" in run and re.search(r'TORCH_PINS="torch torchvision"', run), run
    assert "test-unit" in run, "the job must run the unit tests (the grader's among them)"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"torch\s*[<>=]", d)]
    assert "<" not in spec, f"{spec}: a cap would make pip replace a reader's newer torch"
