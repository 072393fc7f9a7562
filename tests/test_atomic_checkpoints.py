"""Checkpoints that a kill cannot destroy: a save killed at any moment leaves a checkpoint that
loads (a plain torch.save does not), the metrics are atomic writes too, and a snapshot
restores the model, the optimizer, the epoch and the random generators."""
import json
import os
import time

import pytest
import torch
from torch import nn

import helpers
import helpers as hd
from helpers.runtime.files import atomic_save

# --- checkpoints that a kill cannot destroy ---

def _kill_while_saving(tmp_path, save, kills=30, seed=0):
    """Fork a child that saves versions 1, 2, 1, 2, ... of a ~4 MB state to one path, without
    end; SIGKILL it at a random moment, then load the file. Returns (broken, saved): how many
    kills left a file that does not load (or holds a torn mix of versions), and how many found a
    version the child wrote (so the harness really saw saves happen). Version 0 goes first.

    The states are built before forking: the child only serialises and writes. A forked child
    that computes with torch can hang on the parent's thread pool, and then saves nothing."""
    import random
    import signal

    path, rng = tmp_path / "ckpt.pt", random.Random(seed)
    state = lambda v: {"w": torch.full((1024, 1024), float(v)), "version": v}   # 4 MB
    versions = [state(1), state(2)]
    atomic_save(state(0), path)
    broken = saved = 0
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:   # the child: save forever, until killed
            try:
                i = 0
                while True:
                    save(versions[i % 2], path)
                    i += 1
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.005, 0.08))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            s = torch.load(path, weights_only=True)
            ok = bool((s["w"] == s["version"]).all())
            saved += ok and s["version"] > 0
        except Exception:
            ok = False
        broken += not ok
        if not ok:
            atomic_save(state(0), path)   # start the next round from a good file
    return broken, saved


def test_a_checkpoint_killed_mid_save_always_loads(tmp_path):
    """30 SIGKILLs at random moments of atomic saves: the file on disk always loads (the old
    version or the new one), and no temporary file is left in the way of the next save."""
    broken, saved = _kill_while_saving(tmp_path, atomic_save)
    assert saved > 0, "the child never finished a save: the harness tested nothing"
    assert broken == 0
    atomic_save({"x": torch.ones(1)}, tmp_path / "ckpt.pt")   # leftovers do not block it
    left = [p.name for p in tmp_path.iterdir() if p.name != "ckpt.pt"]
    assert not left, f"the next save removes what the killed writers left: {left}"


def test_the_same_kills_break_a_plain_torch_save(tmp_path):
    """The harness above can fail: writing straight to the final path (what save_checkpoint and
    single.py did) leaves files that do not load."""
    broken, _ = _kill_while_saving(tmp_path, torch.save, kills=15)
    assert broken > 0


def test_save_checkpoint_and_metrics_are_atomic_writes(tmp_path, monkeypatch):
    """Every writer goes through atomic_write: a failure mid-write leaves the old file whole."""
    import helpers.runtime.files as hc
    atomic_save({"v": torch.zeros(3)}, tmp_path / "a.pt")
    hc.write_json(tmp_path / "m.json", {"v": 0})

    def exploding_save(obj, f):
        f.write(b"half")
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(OSError):
        hd.save_checkpoint(nn.Linear(2, 2), tmp_path / "a.pt")
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["v"], torch.zeros(3))
    monkeypatch.setattr(hc.json, "dump", lambda obj, f, **k: (f.write("{"), 1 / 0))
    with pytest.raises(ZeroDivisionError):
        hc.write_json(tmp_path / "m.json", {"v": 1})
    assert json.loads((tmp_path / "m.json").read_text()) == {"v": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "m.json"], "no temp files left"


def test_snapshot_restores_model_optimizer_epoch_and_rngs(tmp_path):
    """A snapshot taken mid-run continues bitwise: dropout draws from torch's RNG, momentum lives
    in the optimizer, numpy and random are restored too."""
    import random

    import numpy as np

    def run(net, opt, steps):
        for _ in range(steps):
            X = torch.randn(8, 4) + random.random() + float(np.random.rand())
            loss = net(X).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def fresh():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    random.seed(1), np.random.seed(2)
    net, opt = fresh()
    run(net, opt, 3)
    helpers.save_snapshot(tmp_path / "s.pt", net, opt, epoch=3, history=[{"epoch": 3}])
    run(net, opt, 4)
    torch.manual_seed(99), random.seed(99), np.random.seed(99)   # the crash loses all of it
    net2, opt2 = fresh()
    epoch, history = helpers.load_snapshot(tmp_path / "s.pt", net2, opt2)
    run(net2, opt2, 4)
    assert epoch == 3 and history == [{"epoch": 3}]
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), net2.parameters()))
