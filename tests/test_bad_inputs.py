"""Every bad input a careless user tried, one row each: the call, the exact error type, and the
words that name the fix. All are raised before any work is done.
"""
import argparse
import math
import pathlib
import re

import pytest
import torch

import helpers
from helpers.devices import validate_gpus
from helpers.expert_parallel.moe import expert_capacity
from helpers.runtime.launch import take
from helpers.transformer_costs import train_flops_per_token
from helpers.validate import validate_backend, validate_global_batch

CPU = torch.device("cpu")
X4 = torch.rand(4, 1, 28, 28)
Y4 = torch.arange(4)


def params_on(k):
    return [helpers.get_params(helpers.init_lenet_params(seed=0), CPU) for _ in range(k)]


def no_gpu(monkeypatch):
    monkeypatch.setattr(helpers.devices, "num_gpus", lambda: 0)
    monkeypatch.setattr(helpers.validate, "num_gpus", lambda: 0)


# (id, call, exception type, words that must appear in the message)
ROWS = [
    ("load_tensors subset=-5", lambda: helpers.load_tensors(True, subset=-5), ValueError,
     "subset must be at least 1"),
    ("load_tensors subset=0", lambda: helpers.load_tensors(True, subset=0), ValueError,
     "at least 1"),
    ("loaders batch_size=0", lambda: helpers.load_data_fashion_mnist(0), ValueError,
     "batch_size must be at least 1"),
    ("try_gpu(-1)", lambda: helpers.try_gpu(-1), ValueError, "try_gpu(0)"),
    ("validate_gpus(0)", lambda: validate_gpus(0), ValueError,
     "k must be at least 1, got 0: how many GPUs this needs"),
    ("split_batch no devices", lambda: helpers.split_batch(X4, Y4, []), ValueError,
     "at least one"),
    ("split_batch unpaired", lambda: helpers.split_batch(X4, Y4[:3], [CPU]), ValueError,
     "pair up"),
    ("train_batch X (N,28,28)",
     lambda: helpers.train_batch(X4[:, 0], Y4, params_on(1), [CPU], 0.1), ValueError,
     "add the channel dimension: X.unsqueeze(1)"),
    ("train_batch X uint8",
     lambda: helpers.train_batch((X4 * 255).to(torch.uint8), Y4, params_on(1), [CPU], 0.1),
     TypeError, "X.float() / 255"),
    ("train_batch y float",
     lambda: helpers.train_batch(X4, Y4.float(), params_on(1), [CPU], 0.1), TypeError,
     "y.long()"),
    ("train_batch lr='0.1'",
     lambda: helpers.train_batch(X4, Y4, params_on(1), [CPU], "0.1"), TypeError,
     "pass lr=0.1 without quotes"),
    ("train_batch lr=None", lambda: helpers.train_batch(X4, Y4, params_on(1), [CPU], None),
     TypeError, "lr must be a number"),
    ("train_batch lr=nan", lambda: helpers.train_batch(X4, Y4, params_on(1), [CPU], math.nan),
     ValueError, "finite number above 0"),
    ("train_batch 3 replicas, 2 devices",
     lambda: helpers.train_batch(X4, Y4, params_on(3), [CPU] * 2, 0.1), ValueError,
     "one replica per device"),
    ("train_batch empty batch",
     lambda: helpers.train_batch(X4[:0], Y4[:0], params_on(1), [CPU], 0.1), ValueError,
     "at least one example"),
    ("train num_epochs=0", lambda: helpers.train(1, 64, 0.1, num_epochs=0), ValueError,
     "num_epochs must be at least 1"),
    ("train lr='0.1'", lambda: helpers.train(1, 64, "0.1"), TypeError, "without quotes"),
    ("train batch_size=64.0", lambda: helpers.train(1, 64.0, 0.1), TypeError,
     "pass batch_size=64"),
    ("train seed='0'", lambda: helpers.train(1, 64, 0.1, seed="0"), TypeError,
     "int or None"),
    ("train_fast batch_size=0", lambda: helpers.train_fast(1, 0, 0.1), ValueError,
     "batch_size must be at least 1"),
    ("train_fast batch_size=64.0", lambda: helpers.train_fast(1, 64.0, 0.1), TypeError,
     "pass batch_size=64"),
    ("train_fast subset=0", lambda: helpers.train_fast(1, 64, 0.1, subset=0), ValueError,
     "subset must be at least 1"),
    ("train_fast lr=None", lambda: helpers.train_fast(1, 64, None), TypeError,
     "lr must be a number"),
    ("Timer.median with no times", lambda: helpers.Timer().median(), ValueError,
     "no times recorded"),
    ("global batch 64 over 3 ranks", lambda: validate_global_batch(64, 3), ValueError,
     "use a multiple of 3 (63 or 66)"),
    ("backend mpi", lambda: validate_backend("mpi"), ValueError, "use gloo"),
    ("output in a missing folder", lambda: helpers.validate_output_path("/no/such/dir/m.json",
                                                                     "--metrics"),
     ValueError, "does not exist: create it first"),
    ("output is a folder", lambda: helpers.validate_output_path("/tmp", "--save"), ValueError,
     "is a folder: give a file name"),
    ("--metrics is a folder", lambda: helpers.validate_output_path("/tmp", "--metrics"), ValueError,
     "e.g. /tmp/metrics.json"),
    ("get_devices(True)", lambda: helpers.get_devices(True), TypeError, "e.g. get_devices(2)"),
    ("get_devices(0)", lambda: helpers.get_devices(0), ValueError, "e.g. get_devices(2)"),
    ("train_batch labels 0..12",
     lambda: helpers.train_batch(X4, torch.tensor([0, 1, 12, 3]), params_on(1), [CPU], 0.1),
     ValueError, "labels must be 0..9"),
    ("train_batch devices from a generator",
     lambda: helpers.train_batch(X4, Y4, params_on(2), (d for d in [CPU, CPU]), 0.1), TypeError,
     "pass list(devices)"),
    ("launch timeout=inf", lambda: helpers.launch(print, 2, timeout=math.inf), ValueError,
     "finite number of seconds above 0"),
    ("launch timeout=True", lambda: helpers.launch(print, 2, timeout=True), ValueError,
     "e.g. timeout=300"),
    ("train_batch X float64",
     lambda: helpers.train_batch(X4.double(), Y4, params_on(1), [CPU], 0.1), TypeError,
     "X.to(torch.float32)"),
    # the cost formulas: an impossible count is refused, not answered with a (negative) number
    ("ring_attention_bytes cp=0", lambda: helpers.ring_attention_bytes(100, 64, 0), ValueError,
     "cp must be at least 1"),
    ("ulysses_attention_bytes tokens=-1", lambda: helpers.ulysses_attention_bytes(-1, 64, 2),
     ValueError, "tokens must be a number >= 0"),
    ("bubble_fraction p=0", lambda: helpers.bubble_fraction(0, 4), ValueError,
     "p must be at least 1"),
    ("interleaved_bubble v=0", lambda: helpers.interleaved_bubble(2, 8, 0), ValueError,
     "v must be at least 1"),
    ("zero_bubble_bubble m=0", lambda: helpers.zero_bubble_bubble(2, 0), ValueError,
     "m must be at least 1"),
    ("block_params tp=3 of width 10", lambda: helpers.block_params(10, 3), ValueError,
     "tp=3 must divide the width 10"),
    ("moe_dispatch_bytes k=9 of 8", lambda: helpers.moe_dispatch_bytes(8, 4, 8, 9, 1.0, 2),
     ValueError, "k must be at most the experts"),
    ("moe_dispatch_bytes ep=3 of 8", lambda: helpers.moe_dispatch_bytes(8, 4, 8, 2, 1.0, 3),
     ValueError, "ep must divide them"),
    ("train_flops_per_token recompute='some'",
     lambda: train_flops_per_token(10, 1, 4, 8, recompute="some"), ValueError,
     "recompute must be one of"),
    ("expert_capacity n_experts=0", lambda: expert_capacity(4, 0, 1, 1.0), ValueError,
     "n_experts must be at least 1"),
    ("ring_bytes_per_device k=0", lambda: helpers.ring_bytes_per_device(100, 0), ValueError,
     "k must be at least 1 device"),
    ("ring_bytes_per_device k=-2", lambda: helpers.ring_bytes_per_device(100, -2), ValueError,
     "k must be at least 1 device"),
    ("partition_by_size world=0", lambda: helpers.partition_by_size([1, 2], 0), ValueError,
     "world must be at least 1"),
    ("take a misspelt key", lambda: take(dict(stpes=3), steps=1), TypeError,
     "'stpes' -> 'steps'"),
]


@pytest.mark.parametrize("call,exc,words", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_names_the_fix(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value), f"{type(e.value).__name__}: {e.value}"


def test_counts_are_refused_by_the_one_rule():
    """A count (ranks, devices, micro-batches, repeats) is checked by validate_positive_int, so
    every one is refused alike (TypeError for another kind, ValueError below 1): no module of
    helpers writes the check inline."""
    inline = re.compile(r"not isinstance\((\w+), (?:int|numbers\.Integral)\) or \1 < 1\b")
    pkg = pathlib.Path(helpers.__file__).parent
    found = [f"{p.relative_to(pkg)}:{src[:m.start()].count(chr(10)) + 1}"
             for p in sorted(pkg.rglob("*.py")) if "checks" not in p.parts
             for src in [p.read_text()] for m in inline.finditer(src)]
    assert not found, f"check these counts with helpers.validate_positive_int: {found}"


def test_get_devices_without_gpus_does_not_suggest_k_0(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(RuntimeError) as e:
        helpers.get_devices(2, simulate=False)
    assert "k <= 0" not in str(e.value) and "simulate=True" in str(e.value)


def test_nccl_without_a_gpu_per_rank_says_use_gloo(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(ValueError, match="use --backend gloo, or omit --backend"):
        validate_backend("nccl", local_world_size=2)
    with pytest.raises(ValueError, match="use --backend gloo"):   # setup() checks it first
        helpers.setup(0, 1, backend="nccl", master_port=helpers.free_port())
    assert not torch.distributed.is_initialized()


def test_a_refused_train_batch_leaves_the_replicas_untouched():
    """Reliability row 4: wrong replica counts are refused BEFORE any replica steps or
    accumulates a gradient, so a corrected retry is exactly one step."""
    for replicas, devices in ((3, 2), (2, 3)):
        ps = params_on(replicas)
        before = [[p.detach().clone() for p in r] for r in ps]
        with pytest.raises(ValueError, match="one replica per device"):
            helpers.train_batch(X4, Y4, ps, [CPU] * devices, 0.1)
        assert all(p.grad is None for r in ps for p in r), "gradients accumulated"
        assert all(torch.equal(p, b) for r, rb in zip(ps, before) for p, b in zip(r, rb))


# --- the scripts' command lines: parsed and checked as the scripts do, in this process ---

def resolve(argv, world_size=1, distributed=True):
    p = helpers.script_parser("test", distributed=distributed)
    return helpers.resolve_args(p.parse_args([str(a) for a in argv]), world_size, world_size,
                                parser=p)


SCRIPT_ROWS = [
    ("--epochs 0", ["--epochs", 0], 1, "--epochs must be at least 1"),
    ("--subset 0", ["--subset", 0], 1, "--subset must be at least 1"),
    ("--subset -5", ["--subset", -5], 1, "at least 1"),
    ("--batch-size 0", ["--batch-size", 0], 1, "--batch-size must be at least 1"),
    ("--lr 0", ["--lr", 0], 1, "finite number above 0"),
    ("--lr nan", ["--lr", "nan"], 1, "finite number above 0"),
    ("--batch-size 64 on 3 ranks", ["--batch-size", 64], 3, "use a multiple of 3 (63 or 66)"),
    ("--dry-run on 3 ranks", ["--dry-run"], 3,
     "--batch-size 64 (the --dry-run default) does not split evenly over 3 ranks"),
    ("the default on 3 ranks", [], 3, "--batch-size 256 (the default) does not split"),
    ("--save into a missing folder", ["--save", "/no/such/dir/m.pt"], 1, "does not exist"),
    ("--metrics into a missing folder", ["--metrics", "/no/such/m.json"], 1, "does not exist"),
    ("--resume without a snapshot", ["--resume", "--snapshot", "/tmp/none.pt"], 1,
     "--resume needs --snapshot"),
    ("--timeout 0", ["--timeout", 0], 1, "--timeout must be a finite number of seconds above 0"),
    ("--timeout nan", ["--timeout", "nan"], 1, "--timeout must be a finite number"),
    ("--timeout inf", ["--timeout", "inf"], 1, "--timeout must be a finite number"),
    ("--backend mpi (choices)", ["--backend", "mpi"], 1, "invalid choice: 'mpi'"),
]


@pytest.mark.parametrize("argv,world,words", [r[1:] for r in SCRIPT_ROWS],
                         ids=[r[0] for r in SCRIPT_ROWS])
def test_script_argument_is_refused_before_any_work(argv, world, words, capsys):
    with pytest.raises(SystemExit) as e:
        resolve(argv, world)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_dry_run_fills_only_what_the_user_did_not_give():
    a = resolve(["--dry-run", "--batch-size", 66, "--epochs", 5], world_size=3)
    assert (a.batch_size, a.epochs, a.subset, a.lr) == (66, 5, 512, 0.2)
    a = resolve(["--dry-run"], world_size=2)
    assert (a.batch_size, a.epochs, a.subset) == (64, 2, 512)
    a = resolve([], world_size=2)
    assert (a.batch_size, a.epochs, a.subset, a.lr) == (256, 10, None, 0.2)


def test_the_three_scripts_share_one_batch_rule():
    """single, spawn and torchrun all call resolve_args, which calls validate_global_batch."""
    from book_files import ROOT
    for name in ("single.py", "spawn.py", "torchrun.py"):
        src = (ROOT / "scripts" / "ddp" / name).read_text()
        assert "helpers.resolve_args(" in src, f"{name} does not check its arguments"
        assert "% world_size" not in src and "// 3 * 3" not in src, f"{name} has its own rule"
    assert isinstance(helpers.script_parser("x"), argparse.ArgumentParser)


@pytest.mark.parametrize("script,argv,words", [
    ("single.py", ["--dry-run", "--save", "/no/such/dir/model.pt"], "--save /no/such/dir"),
    ("single.py", ["--dry-run", "--epochs", "0"], "--epochs must be at least 1"),
    ("spawn.py", ["--nprocs", "3", "--dry-run"], "use a multiple of 3 (63 or 66)"),
    ("torchrun.py", ["--dry-run", "--backend", "nccl"], "use --backend gloo"),
    ("torchrun.py", ["--dry-run"], "start it with torchrun"),   # run by python alone
    ("minimal.py", [], "start it with torchrun"),
])
def test_scripts_refuse_before_loading_data_or_starting_processes(script, argv, words, capsys,
                                                                  monkeypatch):
    """Run as `python script argv` (in this process): exit 2 with the fix, and nothing loaded,
    spawned or joined first."""
    import runpy
    import sys

    from book_files import ROOT
    no_gpu(monkeypatch)
    for name in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)    # not under torchrun (setup() sets the port)
    for name in ("load_tensors", "setup"):
        monkeypatch.setattr(helpers, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran first"))
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned"))
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "scripts" / "ddp" / script), run_name="__main__")
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("script", ["single.py", "spawn.py", "torchrun.py"])
@pytest.mark.parametrize("env,words", [
    ("COURSE_DATA", "is a file, not a folder: point COURSE_DATA at a folder"),
    ("COURSE_QUICK", "COURSE_QUICK='maybe' is neither on nor off"),
])
def test_scripts_refuse_a_data_folder_or_a_switch_they_cannot_use(script, env, words, capsys,
                                                                  monkeypatch, tmp_path):
    """One line (exit 2) before any rank starts, not a DataMissingError's tracebacks."""
    import runpy
    import sys

    from book_files import ROOT
    no_gpu(monkeypatch)
    if env == "COURSE_DATA":
        (tmp_path / "data").write_text("")
        monkeypatch.setenv("COURSE_DATA", str(tmp_path / "data"))
    else:
        monkeypatch.setenv("COURSE_QUICK", "maybe")
    monkeypatch.setattr(helpers, "setup", lambda *a, **k: pytest.fail("setup ran first"))
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned"))
    monkeypatch.setattr(sys, "argv", [script, "--dry-run"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "scripts" / "ddp" / script), run_name="__main__")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,env,words", [
    (["--batch-size", "64"], dict(WORLD_SIZE="3"), "a multiple of 3"),
    (["--steps", "0"], dict(WORLD_SIZE="2"), "at least 1 step"),
    (["--dry-run", "--fail-rank", "2"], dict(WORLD_SIZE="2", MASTER_PORT="1"),
     "a rank from 0 to 1"),
])
def test_torchrun_scripts_refuse_their_own_arguments_before_joining(argv, env, words, capsys,
                                                                    monkeypatch):
    """minimal.py (plain torch) and torchrun.py's fault demo, as torchrun starts them."""
    import runpy
    import sys

    from book_files import ROOT
    no_gpu(monkeypatch)
    for k, v in dict(env, LOCAL_RANK="0", RANK="0").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda *a, **k: pytest.fail("joined first"))
    script = "torchrun.py" if "--dry-run" in argv else "minimal.py"
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "scripts" / "ddp" / script), run_name="__main__")
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_torchrun_docs_suggest_a_unique_rendezvous_id_and_a_free_port():
    """Reliability row 10: a reused --rdzv-id or a busy port waits silently for minutes, so the
    script's docstring must not suggest a fixed id, and must say why."""
    from book_files import ROOT
    doc = (ROOT / "scripts" / "ddp" / "torchrun.py").read_text().split('"""')[1]
    assert "--rdzv-id job1" not in doc and "--master-port 29500" not in doc
    assert "UNIQUE" in doc and "waits silently" in doc and "must be free" in doc


# --- environment switches: a value they do not know is refused, not read as "on" ---------------

@pytest.mark.parametrize("name", ["COURSE_QUICK", "COURSE_FULL"])
@pytest.mark.parametrize("value", ["maybe", "fasle", "2", "quick"])
def test_an_environment_switch_refuses_a_value_it_does_not_know(monkeypatch, name, value):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as e:
        helpers.choose("full", "small")
    assert f"{name}={value!r}" in str(e.value) and f"{name}=1" in str(e.value)


@pytest.mark.parametrize("value,on", [("1", True), ("yes", True), ("True", True), (" on ", True),
                                      ("", False), ("0", False), ("no", False), ("false", False),
                                      ("OFF", False)])
def test_an_environment_switch_reads_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv("COURSE_QUICK", value)
    assert helpers.quick() is on
