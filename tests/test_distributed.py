"""Part III: real torchrun launches on the CPU (gloo), and the helpers they rely on (their
checkpoints, which a kill cannot destroy: test_atomic_checkpoints.py).

The launches are the proof of the chapter: 2 ranks train exactly like 1 process on the combined
batch; a dead rank ends the run (non-zero exit); two "nodes" on one machine meet over loopback.
(A stuck rank ending the run within the timeout, and a killed rank restarted by torchrun:
ddp_torchrun's cells, see `launches`.)
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from book_files import ROOT
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers
import helpers as hd
from helpers.data_parallel import torch_api
from helpers.runtime import group

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


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Two torchrun jobs at once (gloo): torchrun.py on two "nodes" of one rank each, meeting
    over loopback, and the plain-torch minimal.py on 2 ranks of one machine.
    Returns {name: ([returncode, ...], [output, ...], folder)}, one entry per launcher.

    The one launch of torchrun.py shows both that 2 ranks train like one process on the combined
    batch and that two nodes meet: torchrun.py's 2 ranks on one machine (--standalone) are
    launched by the test of a dead or stuck rank below and by ddp_torchrun's cells under nbval,
    and one more launch of them here proved nothing more. A killed rank under --max-restarts
    (the whole group restarts and resumes from the epoch's snapshot, bitwise equal to the
    uninterrupted run) is launched and checked by those cells too: the same torchrun.py flags,
    the launcher's exit code and the parameters asserted there, the attempt that ran each epoch
    compared with the stored output."""
    d = tmp_path_factory.mktemp("launches")
    (d / "nodes").mkdir()
    port = helpers.free_port()
    procs = {"nodes": [subprocess.Popen(
        [*LAUNCH, "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port), str(SCRIPT), *ARGS,
         "--backend", "gloo", "--timeout", "30", "--save", str(d / "nodes" / "model.pt"),
         "--metrics", str(d / "nodes" / "m.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=CPU_ENV)
        for i in (0, 1)]}
    (d / "minimal").mkdir()                    # the plain-torch script, beside it
    procs["minimal"] = [subprocess.Popen(
        [*LAUNCH, "--standalone", "--nproc-per-node", "2", str(SCRIPT.parent / "minimal.py"),
         "--steps", "12", "--save", str(d / "minimal" / "model.pt")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=CPU_ENV)]
    try:
        outs = {name: [p.communicate(timeout=150)[0] for p in ps] for name, ps in procs.items()}
    finally:
        for ps in procs.values():
            for p in ps:
                p.kill()
    return {name: ([p.returncode for p in ps], outs[name], d / name)
            for name, ps in procs.items()}


def test_two_ranks_equal_one_process_on_the_combined_batch(launches, reference):
    rcs, outs, d = launches["nodes"]
    assert rcs == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert_same_model(d / "model.pt", reference)
    m = check_metrics(d / "m.json", reference)
    assert m["world_size"] == 2 and m["steps"] == 8
    assert "".join(outs).count("epoch 1:") == 1, "only rank 0 logs"
    assert [len(h["rank_losses"]) for h in m["history"]] == [2, 2], "per-rank losses recorded"


def test_two_nodes_over_loopback(launches):
    """Two torchrun launchers of one rank each (--nnodes 2, a node rank each) meet at node 0's
    address over loopback and form one group of 2 ranks (its training: the test above)."""
    rcs, outs, _ = launches["nodes"]
    assert rcs == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert "2 ranks, backend gloo" in outs[0], outs[0][-2000:]


def minimal_reference(steps, batch_size=64, world=2):
    """One process doing what scripts/ddp/minimal.py does on `world` ranks: each step on the
    combined batch of the ranks' shards (equal shards: the mean of means is the mean)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 16, generator=g)
    y = X @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    dataset = TensorDataset(X, y)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    step, epoch = 0, 0
    while step < steps:
        shards = []
        for r in range(world):
            s = DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=True, seed=0)
            s.set_epoch(epoch)
            shards.append(torch.tensor(list(s)).split(batch_size // world))
        for parts in zip(*shards):
            idx = torch.cat(parts)
            loss = F.mse_loss(net(X[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == steps:
                break
        epoch += 1
    return net


def test_the_plain_torch_script_trains_like_one_process(launches):
    """scripts/ddp/minimal.py (init_process_group, LOCAL_RANK, set_device by hand; rank 0 saves
    while the others wait) equals one process on the combined batch."""
    (rc,), (out,), d = launches["minimal"]
    assert rc == 0, out[-4000:]
    assert "2 ranks over gloo, 12 steps" in out, out[-2000:]
    state = torch.load(d / "model.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state)
    for k, v in minimal_reference(12).state_dict().items():
        assert (state[k] - v).abs().max() < 1e-5, k


def run_script(name, *argv):
    """Run a script in THIS process (no new interpreter to start: fast), as `python name argv`."""
    import contextlib
    import io
    import runpy
    old, out = sys.argv, io.StringIO()
    sys.argv = [name, *map(str, argv)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(SCRIPT.parent / name), run_name="__main__")
    finally:
        sys.argv = old
    return out.getvalue()


def test_single_process_stopped_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path):
    """single.py: 1 epoch with --snapshot, then the same command with --epochs 3 continues from
    it; the result equals a 3-epoch run that never stopped, bitwise."""
    args = ["--subset", 192, "--batch-size", 64, "--lr", 0.1, "--seed", 5]
    snap = tmp_path / "snap.pt"
    run_script("single.py", *args, "--epochs", 3, "--save", tmp_path / "whole.pt")
    run_script("single.py", *args, "--epochs", 1, "--snapshot", snap)
    torch.manual_seed(123)   # whatever the RNGs hold now, the snapshot restores them
    out = run_script("single.py", *args, "--epochs", 3, "--snapshot", snap, "--resume",
                     "--save", tmp_path / "resumed.pt")
    assert "resuming from" in out and "epoch 1:" not in out and "epoch 3:" in out, out
    a = torch.load(tmp_path / "whole.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run differs from the whole run"


def test_the_earlier_steps_run_spawn_equals_one_process_too(tmp_path, reference):
    """scripts/ddp/spawn.py (mp.spawn) trains exactly like the torchrun script; single.py's
    --dry-run runs (in this process while spawn.py's ranks train: an interpreter of its own
    would only import torch once more; the launches above and below start scripts afresh)."""
    ckpt = tmp_path / "spawn.pt"
    spawn = subprocess.Popen([sys.executable, str(SCRIPT.parent / "spawn.py"), "--nprocs", "2",
                              *ARGS, "--save", str(ckpt)], cwd=ROOT, env=CPU_ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        single = run_script("single.py", "--dry-run")
        out = spawn.communicate(timeout=120)[0]
    finally:
        spawn.kill()
    assert spawn.returncode == 0, out[-2000:]
    assert "epoch 2:" in single, single
    assert_same_model(ckpt, reference)


def test_a_dead_rank_ends_the_run():
    """Rank 1 exits at step 3: the launcher must exit non-zero. (A stuck rank, the survivor's
    collective timing out and the launcher failing: ddp_torchrun's cell of the hang asserts it,
    on the same torchrun.py flags; one more launch of it here proved nothing more.)"""
    t0 = time.perf_counter()
    run = subprocess.run(
        [*LAUNCH, "--standalone", "--nproc-per-node", "2", str(SCRIPT), *ARGS, "--fail-rank", "1",
         "--fail-step", "3", "--fail-mode", "exit", "--timeout", "15"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=CPU_ENV,
        timeout=90)
    assert "failing on purpose" in run.stdout, run.stdout[-3000:]
    assert run.returncode != 0, "the launcher reported success although a rank failed"
    print(f"the launcher exited non-zero within {time.perf_counter() - t0:.1f} s")


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
    monkeypatch.setattr(group.dist, "is_nccl_available", lambda: True)
    for gpus, ranks, expected in [(0, 1, "gloo"), (0, 2, "gloo"), (1, 1, "nccl"),
                                  (1, 2, "gloo"), (2, 2, "nccl"), (8, 4, "nccl")]:
        monkeypatch.setattr(group, "num_gpus", lambda g=gpus: g)
        assert hd.choose_backend(ranks) == expected, (gpus, ranks)


@pytest.fixture
def world_of_one():
    helpers.setup(0, 1, master_port=helpers.free_port(), backend="gloo", timeout=30)
    yield
    helpers.teardown()


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
    monkeypatch.setattr(torch_api, "get_world_size", lambda: 2)
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
