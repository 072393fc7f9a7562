"""One way to read a launch target's cfg: take, which refuses a misspelt key (a typo would
otherwise run the default silently and answer with a number). A launch target,
fn(rank, world, cfg), reads cfg only through take (or hands it on whole)."""
import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "helpers"
# not yet converted: Part II/III's fast LeNet and speed runs (their own owners convert them)
NOT_YET = {"data_parallel/fast.py", "data_parallel/speed.py"}


def _targets(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.args]
            if names[:1] == ["rank"] and names[1:2] in (["world"], ["world_size"]) \
                    and names[2:3] == ["cfg"]:
                yield node


def _raw_reads(fn):
    """Lines where fn reads cfg other than through take: cfg[...], cfg.get/pop/items/..."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == "cfg":
            yield node.lineno
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "cfg":
            yield node.lineno


def test_launch_targets_read_cfg_through_take():
    raw, count = [], 0
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("checks/") or rel in NOT_YET:
            continue
        for fn in _targets(ast.parse(path.read_text())):
            count += 1
            raw += [f"helpers/{rel}:{line} ({fn.name})" for line in _raw_reads(fn)]
    assert count >= 40, f"found only {count} launch targets: the scan no longer sees them"
    assert not raw, f"read these with take(cfg, ...): {raw}"


def test_the_scan_sees_a_raw_read():
    """Guard the guard: both spellings of a raw read are found."""
    tree = ast.parse("def t(rank, world, cfg):\n    a = cfg['a']\n    b = cfg.get('b', 1)\n")
    assert list(_raw_reads(next(_targets(tree)))) == [2, 3]
