"""Part III: real torchrun launches on the CPU (gloo), and the helpers they rely on.

The launches are the proof of the chapter: 2 ranks train exactly like 1 process on the combined
batch; a dead or stuck rank ends the run (non-zero exit) within the timeout; two "nodes" on one
machine meet over loopback.
"""
import datetime
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers
import helpers.distributed as hd
from book_files import ROOT

SCRIPT = ROOT / "scripts" / "ddp" / "torchrun.py"
RUN = dict(subset=256, batch_size=64, epochs=2, lr=0.1, seed=3)   # 4 steps an epoch, 2 epochs
ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in RUN.items()]
LAUNCH = [sys.executable, "-m", "torch.distributed.run"]
# CPU and gloo even on a GPU machine: the comparisons are to float32 rounding on the CPU (GPU
# convolutions may use TF32, and two ranks on one GPU would need gloo anyway).
CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def reference_run(world_size=2, subset=256, batch_size=64, epochs=2, lr=0.1, seed=3):
    """One process, one model, each step on the COMBINED batch of all ranks (same samplers)."""
    X, y = helpers.load_tensors(True, subset)
    dataset = TensorDataset(X, y)
    torch.manual_seed(seed)
    net = helpers.lenet_module()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    for epoch in range(epochs):
        shards = []
        for r in range(world_size):
            s = DistributedSampler(dataset, num_replicas=world_size, rank=r, shuffle=True,
                                   seed=seed)
            s.set_epoch(epoch)
            shards.append(torch.tensor(list(s)).split(batch_size // world_size))
        for parts in zip(*shards):
            idx = torch.cat(parts)
            loss = F.cross_entropy(net(X[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net


@pytest.fixture(scope="module")
def reference():
    return reference_run(**RUN)


def assert_same_model(path, reference):
    state = torch.load(path, weights_only=True)
    assert not any(k.startswith("module.") for k in state), "checkpoint keys carry 'module.'"
    for k, v in reference.state_dict().items():
        diff = (state[k] - v).abs().max().item()
        assert diff < 1e-5, f"{k} differs from single-process training by {diff:.2e}"


def check_metrics(path, reference):
    m = json.loads(path.read_text())
    X_test, y_test = helpers.load_tensors(False, RUN["subset"])
    n = len(y_test)   # 51: odd, so a padded DistributedSampler would count 52
    assert m["test_total"] == n, f"evaluated {m['test_total']} examples, the test set has {n}"
    with torch.no_grad():
        correct = int((reference(X_test).argmax(1) == y_test).sum())
    assert abs(m["test_correct"] - correct) <= 1, (m["test_correct"], correct)
    return m


def test_two_ranks_equal_one_process_on_the_combined_batch(tmp_path, reference):
    ckpt, metrics = tmp_path / "model.pt", tmp_path / "m.json"
    r = subprocess.run([*LAUNCH, "--standalone", "--nproc-per-node", "2", str(SCRIPT), *ARGS,
                        "--save", str(ckpt), "--metrics", str(metrics)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=CPU_ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert_same_model(ckpt, reference)
    m = check_metrics(metrics, reference)
    assert m["world_size"] == 2 and m["steps"] == 8
    assert r.stdout.count("epoch 1:") == 1, "only rank 0 logs"


def test_the_earlier_steps_run_spawn_equals_one_process_too(tmp_path, reference):
    """scripts/ddp/spawn.py (mp.spawn) trains exactly like the torchrun script; single.py runs."""
    ckpt = tmp_path / "spawn.pt"
    procs = [subprocess.Popen([sys.executable, str(SCRIPT.parent / "spawn.py"), "--nprocs", "2",
                               *ARGS, "--save", str(ckpt)], cwd=ROOT, env=CPU_ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
             subprocess.Popen([sys.executable, str(SCRIPT.parent / "single.py"), "--dry-run"],
                              cwd=ROOT, env=CPU_ENV, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert "epoch 2:" in outs[1]
    assert_same_model(ckpt, reference)


def test_a_dead_or_a_stuck_rank_ends_the_run():
    """Rank 1 exits at step 3 (one launch) or stops responding there (another launch, at the same
    time): each launcher must exit non-zero, the stuck case within the 3 s collective timeout."""
    t0 = time.perf_counter()
    runs = {mode: subprocess.Popen(
        [*LAUNCH, "--standalone", "--nproc-per-node", "2", str(SCRIPT), *ARGS, "--fail-rank", "1",
         "--fail-step", "3", "--fail-mode", mode, "--timeout", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=CPU_ENV)
        for mode in ("exit", "hang")}
    try:
        outs = {mode: p.communicate(timeout=90)[0] for mode, p in runs.items()}
    finally:
        for p in runs.values():
            p.kill()
    for mode, p in runs.items():
        assert "failing on purpose" in outs[mode], outs[mode][-3000:]
        assert p.returncode != 0, f"{mode}: the launcher reported success although a rank failed"
    hang = outs["hang"]   # the survivor's collective timed out and said why
    assert "ERROR in a collective" in hang and "Timed out" in hang, hang[-3000:]
    print(f"both launchers exited non-zero within {time.perf_counter() - t0:.1f} s")


def test_two_nodes_over_loopback(tmp_path, reference):
    ckpt, port = tmp_path / "model.pt", helpers.free_port()
    nodes = [subprocess.Popen(
        [*LAUNCH, "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port), str(SCRIPT), *ARGS,
         "--backend", "gloo", "--timeout", "30", "--save", str(ckpt)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=CPU_ENV)
        for i in (0, 1)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert "2 ranks, backend gloo" in outs[0]
    assert_same_model(ckpt, reference)


# --- the helpers, without launching anything ---

@pytest.mark.parametrize("n", [0, 1, 5, 51, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_count_every_example_exactly_once(n, world_size):
    shards = [hd.shard_indices(n, r, world_size) for r in range(world_size)]
    assert sorted(torch.cat(shards).tolist()) == list(range(n))
    padded = sum(len(list(DistributedSampler(range(n), world_size, r, shuffle=False)))
                 for r in range(world_size)) if n else 0
    assert padded == (-(-n // world_size)) * world_size   # what the padding would have counted


def test_set_epoch_changes_the_order_and_forgetting_it_does_not():
    s = DistributedSampler(range(100), num_replicas=2, rank=0, shuffle=True, seed=0)
    first = list(s)
    assert list(s) == first, "without set_epoch every epoch repeats the same order"
    s.set_epoch(1)
    second = list(s)
    assert second != first and len(second) == len(first) == 50


def test_backend_choice(monkeypatch):
    monkeypatch.setattr(hd.dist, "is_nccl_available", lambda: True)
    for gpus, ranks, expected in [(0, 1, "gloo"), (0, 2, "gloo"), (1, 1, "nccl"),
                                  (1, 2, "gloo"), (2, 2, "nccl"), (8, 4, "nccl")]:
        monkeypatch.setattr(hd, "num_gpus", lambda g=gpus: g)
        assert hd.choose_backend(ranks) == expected, (gpus, ranks)


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{hd.free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_evaluate_exact_and_checkpoints(world_of_one, tmp_path):
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(helpers.lenet_module())
    X, y = torch.rand(37, 1, 28, 28), torch.randint(0, 10, (37,))
    correct, total = hd.evaluate_exact(net, X, y, "cpu", batch_size=8)
    assert total == 37
    assert correct == int((net.module(X).argmax(1) == y).sum())
    assert hd.save_checkpoint(net, tmp_path / "a.pt")
    assert not any(k.startswith("module.") for k in torch.load(tmp_path / "a.pt"))
    torch.save(net.state_dict(), tmp_path / "b.pt")   # the trap: keys start with "module."
    fresh = helpers.lenet_module()
    hd.load_checkpoint(fresh, tmp_path / "b.pt")
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), net.module.parameters()))


def test_cpu_sync_batchnorm_matches_batchnorm(world_of_one, monkeypatch):
    """The statistics path of CPUSyncBatchNorm (forced on, over a world of one) gives BatchNorm2d's
    outputs, gradients and running statistics."""
    monkeypatch.setattr(hd, "get_world_size", lambda: 2)
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    sync = hd.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), "cpu")[0]
    assert isinstance(sync, hd.CPUSyncBatchNorm)
    X = torch.randn(8, 3, 5, 5) * 3 + 2
    X1, X2, w = X.clone().requires_grad_(), X.clone().requires_grad_(), torch.randn(8, 3, 5, 5)
    Y1, Y2 = bn(X1), sync(X2)
    (Y1 * w).sum().backward()
    (Y2 * w).sum().backward()
    assert torch.allclose(Y1, Y2, atol=1e-5) and torch.allclose(X1.grad, X2.grad, atol=1e-5)
    assert torch.allclose(bn.running_var, sync.running_var, atol=1e-5)
    assert torch.allclose(bn.running_mean, sync.running_mean, atol=1e-6)
