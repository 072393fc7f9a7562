"""One way to read a launch target's cfg: take, which refuses a misspelt key (a typo would
otherwise run the default silently and answer with a number). A launch target,
fn(rank, world, cfg), reads cfg only through take (or hands it on whole), and lives where
CONTRIBUTING says a chapter's run across processes goes: the split's `experiments.py` or a
`*_experiments.py` beside it (the runtime's own run_in_turn aside: it runs other targets)."""
import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "helpers"


def _targets(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.args]
            if names[:1] == ["rank"] and len(names) >= 3 and names[2] == "cfg":
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


def _scan(sources):
    """(launch targets seen, raw reads as 'helpers/<file>:<line> (<fn>)') over {rel: text}."""
    raw, count = [], 0
    for rel, text in sources.items():
        for fn in _targets(ast.parse(text)):
            count += 1
            raw += [f"helpers/{rel}:{line} ({fn.name})" for line in _raw_reads(fn)]
    return count, raw


def _package_sources():
    return {p.relative_to(PKG).as_posix(): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_launch_targets_read_cfg_through_take():
    count, raw = _scan(_package_sources())
    assert count >= 40, f"found only {count} launch targets: the scan no longer sees them"
    assert not raw, f"read these with take(cfg, ...): {raw}"


def _misnamed(sources):
    """'helpers/<file> (<fn>)' for each launch target whose second argument is not `world`."""
    return [f"helpers/{rel} ({fn.name})" for rel, text in sources.items()
            for fn in _targets(ast.parse(text)) if fn.args.args[1].arg != "world"]


def test_launch_targets_call_the_world_size_world():
    """One signature, fn(rank, world, cfg), for every target: a reader who has seen one has
    seen them all."""
    misnamed = _misnamed(_package_sources())
    assert not misnamed, f"name the second argument `world`: {misnamed}"


def test_the_name_scan_fails_on_world_size():
    """Guard the guard: a target spelt (rank, world_size, cfg) is found."""
    sources = {"sharding/knobs_experiments.py":
               "def t(rank, world_size, cfg):\n    return rank\n"}
    assert _misnamed(sources) == ["helpers/sharding/knobs_experiments.py (t)"]


def test_the_scan_sees_a_raw_read():
    """Guard the guard: both spellings of a raw read are found."""
    tree = ast.parse("def t(rank, world, cfg):\n    a = cfg['a']\n    b = cfg.get('b', 1)\n")
    assert list(_raw_reads(next(_targets(tree)))) == [2, 3]


def test_the_package_scan_fails_on_a_raw_read_put_back():
    """A raw read put back into a converted target (the fast trainer's) fails the scan."""
    sources = _package_sources()
    rel = "data_parallel/fast_experiments.py"
    text = sources[rel]
    at = text.index("def train_fast_rank(rank, world, cfg):")
    body = text.index("    import torch.distributed as dist\n", at)
    sources[rel] = text[:body] + "    lr = cfg.get('lr')\n" + text[body:]
    _, raw = _scan(sources)
    assert [r for r in raw if "(train_fast_rank)" in r and r.startswith(f"helpers/{rel}:")]


def _misplaced(sources):
    """'helpers/<file> (<fn>)' for each launch target outside an experiments module."""
    return [f"helpers/{rel} ({fn.name})" for rel, text in sources.items()
            if not rel.startswith("runtime/") and not _in_experiments(rel)
            for fn in _targets(ast.parse(text))]


def _in_experiments(rel):
    name = pathlib.PurePosixPath(rel).name
    return name == "experiments.py" or name.endswith("_experiments.py")


def test_launch_targets_live_in_experiments_modules():
    misplaced = _misplaced(_package_sources())
    assert not misplaced, ("move these launch targets into the split's experiments.py or a "
                           f"*_experiments.py beside it (CONTRIBUTING.md): {misplaced}")


def test_the_place_scan_fails_on_a_target_in_a_figure_module():
    """Guard the guard: a launch target put back into a schematics module is found, and one in
    an experiments module is not."""
    sources = _package_sources()
    target = "\n\ndef traffic(rank, world, cfg):\n    return rank\n"
    rel = "data_parallel/schematics/syncbn_schematics.py"
    sources[rel] += target
    sources["sharding/knobs_experiments.py"] += target
    assert _misplaced(sources) == [f"helpers/{rel} (traffic)"]
