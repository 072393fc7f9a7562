"""Step 3 of 3: the same training under torchrun, which starts one process per rank and tells each
its RANK, LOCAL_RANK and WORLD_SIZE. The same file runs on one machine or on many.

    # one machine, 2 ranks (gloo on a CPU, NCCL when each rank has a GPU)
    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        scripts/ddp/torchrun.py --dry-run
    # two machines: run on each, with --node-rank 0 on the machine at MASTER_IP, 1 on the other
    python -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 8 \
        --master-addr MASTER_IP --master-port 29500 scripts/ddp/torchrun.py
    # or elastic rendezvous (ranks handed out on arrival, no --node-rank):
    #   --rdzv-backend c10d --rdzv-endpoint MASTER_IP:29500 --rdzv-id job1
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--batch-size", type=int, default=256, help="global batch, split over the ranks")
p.add_argument("--lr", type=float, default=0.2)
p.add_argument("--subset", type=int, default=None, help="first N training images (None: all)")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--dry-run", action="store_true", help="CI size: 2 short epochs on 512 images")
p.add_argument("--save", default=None, help="rank 0 saves the model's state_dict here")
p.add_argument("--metrics", default=None, help="rank 0 writes a JSON summary here")
p.add_argument("--backend", default=None, help="gloo or nccl (default: nccl iff a GPU per rank)")
p.add_argument("--timeout", type=float, default=60, help="seconds a collective may wait")
p.add_argument("--fail-rank", type=int, default=-1, help="(demo) this rank fails ...")
p.add_argument("--fail-step", type=int, default=3, help="(demo) ... at this step ...")
p.add_argument("--fail-mode", default="exit", choices=["exit", "hang"], help="(demo) ... so")
args = p.parse_args()
if args.dry_run:
    args.epochs, args.subset, args.batch_size = 2, 512, 64

# --- join the process group: ranks from torchrun's environment variables ---
rank, world_size, device = helpers.setup(backend=args.backend, timeout=args.timeout)
backend = dist.get_backend()
helpers.log0(f"{world_size} ranks, backend {backend}, rank 0 on {device}")
if args.batch_size % world_size:
    raise SystemExit(f"--batch-size {args.batch_size} must be divisible by {world_size} ranks")

# --- data: every rank sees its own shard, reshuffled each epoch by set_epoch ---
X, y = helpers.load_tensors(True, args.subset)
X_test, y_test = helpers.load_tensors(False, args.subset)
train_set = TensorDataset(X, y)
sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                             seed=args.seed)
train_iter = DataLoader(train_set, args.batch_size // world_size, sampler=sampler)

# --- model: same start on every rank (DDP also broadcasts rank 0's weights) ---
torch.manual_seed(args.seed)
model = DDP(helpers.lenet_module().to(device),
            device_ids=[device.index] if device.type == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
loss_fn = nn.CrossEntropyLoss()

step, times = 0, []
try:
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)   # without it every epoch repeats epoch 0's order
        t0 = time.perf_counter()
        loss_sum = torch.zeros(2, device=device)
        for Xb, yb in train_iter:
            if rank == args.fail_rank and step == args.fail_step:
                print(f"rank {rank}: failing on purpose at step {step} ({args.fail_mode})",
                      flush=True)
                if args.fail_mode == "exit":
                    os._exit(3)
                time.sleep(100 * args.timeout)   # "hang": alive but no longer in step
            Xb, yb = Xb.to(device), yb.to(device)
            loss = loss_fn(model(Xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()   # DDP all-reduces (averages) the gradients here
            optimizer.step()
            loss_sum += torch.stack([loss.detach() * len(yb), torch.tensor(len(yb), device=device)])
            step += 1
        dist.all_reduce(loss_sum)   # every rank runs the same collectives, evaluation included
        correct, total = helpers.evaluate_exact(model, X_test, y_test, device)
        helpers.synchronize(device)
        times.append(time.perf_counter() - t0)
        helpers.log0(f"epoch {epoch + 1}: train loss {(loss_sum[0] / loss_sum[1]).item():.3f}, "
                     f"test acc {correct / total:.3f} on {total} images, {times[-1]:.2f} s")
except RuntimeError as e:   # a collective timed out or a peer vanished
    print(f"rank {rank}: ERROR in a collective at step {step}: another rank died or stopped "
          f"responding (timeout {args.timeout:g} s).\n  {str(e).splitlines()[0]}", flush=True)
    raise

if args.save:
    helpers.save_checkpoint(model, args.save)   # rank 0 only, keys without "module."
if args.metrics and rank == 0:
    with open(args.metrics, "w") as f:
        json.dump(dict(world_size=world_size, backend=backend, device=str(device), steps=step,
                       test_correct=correct, test_total=total, test_acc=correct / total,
                       epoch_times=times), f)
helpers.teardown()
