"""Resuming from --snapshot: a damaged or foreign file is refused with its name
and what to do, before any work; what changed since the snapshot (the lr, the epochs, the
ranks) is decided and said at argument time. All in this process: no rank is started."""
import json
import os
import pickle
import runpy
import sys

import pytest
import torch
from book_files import ROOT

import helpers
from helpers.runtime.checkpoint import rng_state
from helpers.validate import SnapshotError


def resolve(argv, world_size=1):
    p = helpers.script_parser("test", distributed=True)
    return helpers.resolve_args(p.parse_args([str(a) for a in argv]), world_size, world_size,
                                parser=p)


def refused(argv, capsys, world_size=1):
    """The message resolve_args exits with (code 2)."""
    with pytest.raises(SystemExit) as e:
        resolve(argv, world_size)
    assert e.value.code == 2
    return capsys.readouterr().err


def lenet_snapshot(path, epoch=2, lr=0.2, ranks=1):
    torch.manual_seed(0)
    net = helpers.lenet_module()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    helpers.save_snapshot(path, net, opt, epoch, history=[{"epoch": e + 1} for e in range(epoch)],
                          rng=[rng_state()] * ranks)
    return path


class Evil:
    def __reduce__(self):
        return os.system, ("touch PWNED",)


def damaged(tmp_path, kind):
    """A --snapshot file of each damaged kind below: each must be refused, never resumed."""
    f = tmp_path / f"{kind.replace(' ', '_')}.pt"
    good = lenet_snapshot(tmp_path / "good.pt").read_bytes()
    if kind == "truncated":
        f.write_bytes(good[:len(good) // 2])
    elif kind == "empty":
        f.write_bytes(b"")
    elif kind == "random bytes":
        f.write_bytes(torch.randint(0, 256, (5000,), dtype=torch.uint8).numpy().tobytes())
    elif kind == "a JSON file":
        f.write_text(json.dumps({"epoch": 3}))
    elif kind == "the --save checkpoint":
        torch.save(helpers.lenet_module().state_dict(), f)
    elif kind == "pickled code":
        f.write_bytes(pickle.dumps(Evil(), protocol=2))
    return f


KINDS = ["truncated", "empty", "random bytes", "a JSON file", "the --save checkpoint",
         "pickled code"]
WHY = {"empty": "is empty", "the --save checkpoint": "a model's state_dict"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_or_foreign_snapshot_is_refused_naming_the_file_and_the_fix(
        tmp_path, capsys, kind, monkeypatch):
    monkeypatch.chdir(tmp_path)                      # where "touch PWNED" would land
    f = damaged(tmp_path, kind)
    err = refused(["--snapshot", f, "--epochs", 3], capsys)
    assert str(f) in err and "delete it to start afresh" in err, err
    assert WHY.get(kind, "cannot be read") in err, err
    net = helpers.lenet_module()                     # the library call says the same, and
    before = [p.detach().clone() for p in net.parameters()]   # restores nothing
    with pytest.raises(SnapshotError, match="delete it to start afresh"):
        helpers.load_snapshot(f, net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    assert not (tmp_path / "PWNED").exists()


def test_save_and_snapshot_on_one_file_are_refused(tmp_path, capsys):
    """--save X --snapshot X let a finished run turn its snapshot into a checkpoint
    that blocks every later resume. Any two of --save, --metrics, --snapshot are refused."""
    x = tmp_path / "run.pt"
    err = refused(["--save", x, "--snapshot", x], capsys)
    assert "--save and --snapshot are the same file" in err
    err = refused(["--metrics", x, "--snapshot", tmp_path / "." / "run.pt"], capsys)
    assert "--metrics and --snapshot are the same file" in err


@pytest.mark.parametrize("script", ["single.py", "torchrun.py"])
def test_the_scripts_refuse_a_damaged_snapshot_before_any_work(tmp_path, capsys, monkeypatch,
                                                               script):
    """Run as `python script --snapshot trunc.pt` (in this process): exit 2 with the message,
    before data, process group or model. Under torchrun --max-restarts every attempt runs the
    same check and ends the same way, fast, instead of a raw traceback per rank."""
    f = damaged(tmp_path, "truncated")
    for name in ("load_tensors", "setup", "load_snapshot"):
        monkeypatch.setattr(helpers, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran first"))
    monkeypatch.setattr(sys, "argv", [script, "--dry-run", "--snapshot", str(f)])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "scripts" / "ddp" / script), run_name="__main__")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"the snapshot {f} cannot be read" in err and "delete it to start afresh" in err


# --- what changed since the snapshot ---

def test_a_typed_lr_replaces_the_saved_one_and_says_so(tmp_path, capsys):
    snap = lenet_snapshot(tmp_path / "s.pt", epoch=1, lr=0.2)
    a = resolve(["--snapshot", snap, "--epochs", 3, "--lr", 0.001])
    assert a.lr == 0.001
    assert f"--lr 0.001 replaces the lr 0.2 saved in {snap}" in capsys.readouterr().out
    net = helpers.lenet_module()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr)
    helpers.load_snapshot(snap, net, opt, lr=a.lr)
    assert opt.param_groups[0]["lr"] == 0.001


def test_without_lr_the_run_goes_on_with_the_saved_one(tmp_path, capsys):
    snap = lenet_snapshot(tmp_path / "s.pt", epoch=1, lr=0.05)
    a = resolve(["--snapshot", snap, "--epochs", 3])
    assert a.lr == 0.05, "the default 0.2 must not replace the lr the run was started with"
    assert "replaces" not in capsys.readouterr().out


def test_epochs_below_the_saved_epoch_are_refused(tmp_path, capsys):
    snap = lenet_snapshot(tmp_path / "s.pt", epoch=3)
    err = refused(["--snapshot", snap, "--epochs", 2], capsys)
    assert "has already run 3 epochs, more than --epochs 2" in err and "--epochs 3 or more" in err


def test_a_finished_snapshot_trains_nothing_and_keeps_what_the_run_wrote(tmp_path, capsys):
    """--epochs equal to the saved epoch: said, and the finished run's --metrics and --save are
    kept (not rewritten); one that is missing (the run died after its last snapshot) is
    written."""
    snap = lenet_snapshot(tmp_path / "s.pt", epoch=2)
    (tmp_path / "m.json").write_text("{}")
    a = resolve(["--snapshot", snap, "--epochs", 2, "--metrics", tmp_path / "m.json",
                 "--save", tmp_path / "model.pt"])
    out = capsys.readouterr().out
    assert "already holds all 2 epochs: nothing left to train" in out
    assert a.metrics is None and "kept as the finished run wrote it" in out
    assert str(a.save) == str(tmp_path / "model.pt")


@pytest.mark.parametrize("ranks,world", [(2, 1), (2, 3), (1, 2)])
def test_another_number_of_ranks_is_refused(tmp_path, capsys, ranks, world):
    """Fewer ranks than saved resumed silently with another data order; more failed on the new
    rank only, after the others had joined. Both are refused at argument time, on every rank."""
    snap = lenet_snapshot(tmp_path / "s.pt", ranks=ranks)
    argv = ["--snapshot", snap, "--epochs", 3, "--batch-size", 6 * world]
    err = refused(argv, capsys, world_size=world)
    said = helpers.plural(ranks, "rank")   # '1 rank', '2 ranks'
    assert f"saved by {said} and this run has {world}" in err
    assert f"resume with {said}" in err


def test_load_snapshot_refuses_a_snapshot_of_more_ranks(tmp_path):
    snap = lenet_snapshot(tmp_path / "s.pt", ranks=2)
    net = helpers.lenet_module()
    with pytest.raises(SnapshotError, match="saved by 2 rank"):
        helpers.load_snapshot(snap, net, torch.optim.SGD(net.parameters(), lr=0.1))
