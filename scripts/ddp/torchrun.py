"""Step 3 of 3: the same training under torchrun, which starts one process per rank and tells each
its RANK, LOCAL_RANK and WORLD_SIZE. The same file runs on one machine or on many.

    # one machine, 2 ranks (gloo on a CPU, NCCL when each rank has a GPU)
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        scripts/ddp/torchrun.py --dry-run
    # a job that survives a dead rank: torchrun restarts ALL ranks (up to 3 times), and every
    # rank continues from the last snapshot (on several machines: a path every node sees)
    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 3 \\
        scripts/ddp/torchrun.py --snapshot snap.pt
    # two machines: run on each, with --node-rank 0 on the machine at MASTER_IP, 1 on the other;
    # PORT must be free on MASTER_IP (a busy port makes the others wait silently). Name the
    # backend (--backend gloo) unless every rank has a GPU: machines never fall back alone.
    # --snapshot must be on storage every node sees: rank 0 decides whether to resume and from
    # which epoch, and every rank loads that file (a node that cannot see it stops with an error)
    python -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
        --master-addr MASTER_IP --master-port PORT scripts/ddp/torchrun.py
    # or elastic rendezvous (ranks handed out on arrival, no --node-rank), with an id UNIQUE to
    # this job (e.g. $SLURM_JOB_ID or $(uuidgen)): a second job that reuses an id or an endpoint
    # still in use waits silently for minutes instead of failing
    #   --rdzv-backend c10d --rdzv-endpoint MASTER_IP:PORT --rdzv-id $SLURM_JOB_ID
torchrun's own key-value store (the rendezvous) listens on EVERY network interface of its
machine, without authentication, even with --standalone (torch 2.14: seen with `ss -ltnp`): run
it on a machine and network you trust, or firewall its ports. (helpers.launch and spawn.py start
their own store on 127.0.0.1 only.)
Every argument is checked before the process group starts; --dry-run only fills in what was not
given.
"""
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers

p = helpers.script_parser(__doc__, distributed=True)
p.add_argument("--fail-rank", type=int, default=-1, help="(demo) this rank fails ...")
p.add_argument("--fail-step", type=int, default=3, help="(demo) ... at this global step ...")
p.add_argument("--fail-mode", default="exit", choices=["exit", "kill", "hang"],
               help="(demo) ... so (exit: os._exit(3); kill: SIGKILL; hang: stops responding)")
p.add_argument("--fail-once", default=None,
               help="(demo) ... only if this marker file does not exist yet (it is created)")
_, _, env_world, env_local_world = helpers.env_ranks()
args = helpers.resolve_args(p.parse_args(), env_world, env_local_world, parser=p)
if "TORCHELASTIC_RUN_ID" not in os.environ and "MASTER_PORT" not in os.environ:
    p.error("start it with torchrun, which tells each rank who it is: python -m "
            "torch.distributed.run --standalone --nproc-per-node 2 scripts/ddp/torchrun.py ...")
if not -1 <= args.fail_rank < env_world or args.fail_step < 0:
    p.error(f"--fail-rank {args.fail_rank} --fail-step {args.fail_step}: the demo needs a rank "
            f"from 0 to {env_world - 1} (or -1: none) and a step from 0 on")

# --- join the process group: ranks from torchrun's environment variables ---
rank, world_size, device = helpers.setup(backend=args.backend, timeout=args.timeout)
backend = dist.get_backend()
helpers.log0(f"{world_size} ranks, backend {backend}, rank 0 on {device}")

# --- data: every rank sees its own shard, reshuffled each epoch by set_epoch ---
X, y = helpers.load_tensors(True, args.subset)
X_test, y_test = helpers.load_tensors(False, args.subset)
train_set = TensorDataset(X, y)
sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                             seed=args.seed)
train_iter = DataLoader(train_set, args.batch_size // world_size, sampler=sampler,
                        pin_memory=device.type == "cuda")   # copies that need no wait

# --- model: same start on every rank (DDP also broadcasts rank 0's weights) ---
torch.manual_seed(args.seed)
net = helpers.lenet_module().to(device)
torch.manual_seed(args.seed + 1 + rank)   # then per-rank randomness (dropout, augmentation)
optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
loss_fn = nn.CrossEntropyLoss()

# --- resume: rank 0 decides from the snapshot it sees; every rank loads that same file (on
# storage every node sees) before DDP wraps the model, whose broadcast then starts all alike ---
start, history = 0, []
if args.snapshot:
    found = torch.tensor([int(rank == 0 and os.path.exists(args.snapshot))], device=device)
    dist.broadcast(found, src=0)
    if found.item():
        if not os.path.exists(args.snapshot):
            raise FileNotFoundError(f"rank {rank}: rank 0 resumes from {args.snapshot}, which this "
                                    "machine cannot see: put --snapshot on storage every node "
                                    "sees (a shared filesystem)")
        start, history = helpers.load_snapshot(args.snapshot, net, optimizer, rank, args.lr)
        first = torch.tensor([start], device=device)
        dist.broadcast(first, src=0)
        if first.item() != start:
            raise RuntimeError(f"rank {rank} read epoch {start} from {args.snapshot}, rank 0 "
                               f"epoch {first.item()}: every node must see the same file")
        helpers.log0(f"resuming from {args.snapshot} at epoch {start + 1}")
model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)


def fail_on_purpose(step):
    """The fault-tolerance demo: this rank dies (or hangs) at the given step, once."""
    if args.fail_once:
        if os.path.exists(args.fail_once):
            return
        open(args.fail_once, "w").close()
    print(f"rank {rank}: failing on purpose at step {step} ({args.fail_mode})", flush=True)
    if args.fail_mode == "exit":
        os._exit(3)
    if args.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(100 * args.timeout)   # "hang": alive but no longer in step


step = start * len(train_iter)
try:
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)   # without it every epoch repeats epoch 0's order
        t0 = helpers.synced_now(device)
        loss_sum = torch.zeros(2, device=device)   # (sum of losses, examples) on the device
        for Xb, yb in train_iter:
            if rank == args.fail_rank and step == args.fail_step:
                fail_on_purpose(step)
            Xb, yb = Xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = loss_fn(model(Xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()   # DDP all-reduces (averages) the gradients here
            optimizer.step()
            loss_sum[0] += loss.detach() * len(yb)
            loss_sum[1] += len(yb)
            step += 1
        rank_sums = [torch.zeros_like(loss_sum) for _ in range(world_size)]
        dist.all_gather(rank_sums, loss_sum)   # every rank runs the same collectives
        loss_sum = sum(rank_sums)
        correct, total = helpers.evaluate_exact(model, X_test, y_test, device)
        history.append(dict(epoch=epoch + 1, loss=(loss_sum[0] / loss_sum[1]).item(),
                            rank_losses=[(s[0] / s[1]).item() for s in rank_sums],
                            test_acc=correct / total, seconds=helpers.synced_now(device) - t0,
                            attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))))
        helpers.log0(f"epoch {epoch + 1}: train loss {history[-1]['loss']:.3f}, "
                     f"test acc {correct / total:.3f} on {total} images, "
                     f"{history[-1]['seconds']:.2f} s")
        if args.snapshot:
            helpers.save_snapshot_all(args.snapshot, model, optimizer, epoch + 1, history)
    correct, total = helpers.evaluate_exact(model, X_test, y_test, device)   # the final model
except RuntimeError as e:   # a collective timed out or a peer vanished
    print(f"rank {rank}: ERROR in a collective at step {step}: another rank died or stopped "
          f"responding (timeout {args.timeout:g} s).\n  {str(e).splitlines()[0]}", flush=True)
    raise

if args.save:
    helpers.save_checkpoint(model, args.save)   # rank 0 only, atomically, keys without "module."
if args.metrics and rank == 0:
    helpers.write_json(args.metrics, dict(
        world_size=world_size, backend=backend, device=str(device), steps=step,
        test_correct=correct, test_total=total, test_acc=correct / total,
        epoch_times=[h["seconds"] for h in history], history=history))
# DDP holds the process group: drop it first, so that leaving the group ends gloo's threads
# now, not at interpreter exit (where torch 2.11 can abort or hang)
del model, optimizer
helpers.teardown()
