"""Step 2 of 3: data-parallel with DistributedDataParallel, one process per rank started by
torch.multiprocessing.spawn. The training body of single.py moves into main(rank, ...), which
spawn pickles by name: it must live in a file (a script or a module), never in a notebook.

    python scripts/ddp/spawn.py --nprocs 2 --dry-run
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers


def main(rank, world_size, port, args):
    # --- join the process group: this rank's number comes from spawn ---
    rank, world_size, device = helpers.setup(rank, world_size, master_port=port,
                                             timeout=args.timeout)
    helpers.log0(f"{world_size} ranks, backend {dist.get_backend()}, rank 0 on {device}")

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
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)   # without it every epoch repeats epoch 0's order
        t0 = time.perf_counter()
        loss_sum = torch.zeros(2, device=device)
        for Xb, yb in train_iter:
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

    if args.save:
        helpers.save_checkpoint(model, args.save)   # rank 0 only, keys without "module."
    if args.metrics and rank == 0:
        with open(args.metrics, "w") as f:
            json.dump(dict(world_size=world_size, backend=dist.get_backend(), device=str(device),
                           steps=step, test_correct=correct, test_total=total,
                           test_acc=correct / total, epoch_times=times), f)
    helpers.teardown()


if __name__ == "__main__":   # spawn re-imports this file in each child: guard the launch
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=max(helpers.num_gpus(), 2))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256, help="global batch, split over ranks")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--subset", type=int, default=None, help="first N training images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="CI size: 2 short epochs, 512 images")
    p.add_argument("--save", default=None, help="rank 0 saves the model's state_dict here")
    p.add_argument("--metrics", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--timeout", type=float, default=60, help="seconds a collective may wait")
    args = p.parse_args()
    if args.dry_run:
        args.epochs, args.subset, args.batch_size = 2, 512, 64
    mp.spawn(main, args=(args.nprocs, helpers.free_port(), args), nprocs=args.nprocs)
