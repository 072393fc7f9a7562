"""DDP in plain torch, nothing from the course: the lines a DDP script of your own needs (what
helpers.setup and torchrun.py do for the course's scripts). Launch it with torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ddp/minimal.py

It fits a small network to fixed random data (so it runs anywhere, GPUs or not).
"""
import argparse
import datetime
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser(description="DDP in plain torch")
p.add_argument("--steps", type=int, default=24, help="optimizer steps")
p.add_argument("--batch-size", type=int, default=64, help="global batch (all ranks)")
p.add_argument("--save", default=None, help="checkpoint file, written by rank 0")
args = p.parse_args()
world = int(os.environ.get("WORLD_SIZE", 0))   # set by torchrun: refuse what would fail or,
if not world:                                  # with a batch the ranks cannot share, mislead
    p.error("start it with torchrun: python -m torch.distributed.run --standalone "
            "--nproc-per-node 2 scripts/ddp/minimal.py")
if args.steps < 1 or args.batch_size < 1 or args.batch_size % world:
    p.error(f"--steps {args.steps} --batch-size {args.batch_size}: need at least 1 step and a "
            f"global batch that splits evenly over the {world} ranks (a multiple of {world})")

# --- join the process group: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT ---
local_rank = int(os.environ["LOCAL_RANK"])    # this rank's number on its machine
if torch.cuda.device_count() > local_rank:    # a GPU of its own: NCCL
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)             # before anything else touches CUDA
    backend = "nccl"
else:                                         # no GPU (or too few): gloo on the CPU
    device, backend = torch.device("cpu"), "gloo"
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60),  # a hang: an error
                        device_id=device if backend == "nccl" else None)  # NCCL: bound now
rank, world_size = dist.get_rank(), dist.get_world_size()

# --- data: every rank sees its own shard of each global batch ---
g = torch.Generator().manual_seed(0)
X = torch.randn(512, 16, generator=g)
y = X @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
dataset = TensorDataset(X, y)
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler)

# --- model: the same start on every rank (DDP also broadcasts rank 0's weights) ---
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)
torch.manual_seed(1 + rank)   # then per-rank randomness: dropout masks, augmentation differ
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)   # a new order every epoch, the same on every rank
    for Xb, yb in loader:
        loss = nn.functional.mse_loss(model(Xb.to(device)), yb.to(device))
        optimizer.zero_grad()
        loss.backward()        # DDP all-reduces the gradients: the average over the ranks
        optimizer.step()
        step += 1
        if step == args.steps:
            break
    epoch += 1

# --- rank 0 writes the checkpoint (the module inside DDP: keys without "module."); the others
# wait for it before going on (here: before leaving) ---
if args.save and rank == 0:
    torch.save(model.module.state_dict(), args.save)
dist.barrier()
if rank == 0:
    print(f"{world_size} ranks over {backend}, {step} steps, last loss {loss.item():.4f}")
del model, optimizer           # DDP holds the process group: free it before leaving the group
gc.collect()   # what DDP left in reference cycles, which `del` alone does not free: left to
dist.destroy_process_group()   # interpreter exit, gloo's threads can abort it (SIGABRT)
