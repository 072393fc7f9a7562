"""Step 2 of 3: data-parallel with DistributedDataParallel, one process per rank started by
torch.multiprocessing.spawn. The training body of single.py moves into main(rank, ...), which
spawn pickles by name: it must live in a file (a script or a module), never in a notebook.

    python scripts/ddp/spawn.py --nprocs 2 --dry-run
Every argument is checked before any process starts; --dry-run only fills in what was not given.
"""
import os

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
                                             backend=args.backend, timeout=args.timeout)
    helpers.log0(f"{world_size} ranks, backend {dist.get_backend()}, rank 0 on {device}")

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
    model = DDP(helpers.lenet_module().to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    torch.manual_seed(args.seed + 1 + rank)   # then per-rank randomness (dropout, augmentation)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    # --- resume: model, optimizer, next epoch and RNG states from the last snapshot ---
    start, history = 0, []
    if args.snapshot and os.path.exists(args.snapshot):
        start, history = helpers.load_snapshot(args.snapshot, model, optimizer, rank, args.lr)
        helpers.log0(f"resuming from {args.snapshot} at epoch {start + 1}")

    step = start * len(train_iter)
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)   # without it every epoch repeats epoch 0's order
        t0 = helpers.synced_now(device)
        loss_sum = torch.zeros(2, device=device)   # (sum of losses, examples) on the device
        for Xb, yb in train_iter:
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
                            test_acc=correct / total, seconds=helpers.synced_now(device) - t0))
        helpers.log0(f"epoch {epoch + 1}: train loss {history[-1]['loss']:.3f}, "
                     f"test acc {correct / total:.3f} on {total} images, "
                     f"{history[-1]['seconds']:.2f} s")
        if args.snapshot:
            helpers.save_snapshot_all(args.snapshot, model, optimizer, epoch + 1, history)
    correct, total = helpers.evaluate_exact(model, X_test, y_test, device)   # the final model

    if args.save:
        helpers.save_checkpoint(model, args.save)   # rank 0 only, atomically, no "module."
    if args.metrics and rank == 0:
        helpers.write_json(args.metrics, dict(
            world_size=world_size, backend=dist.get_backend(), device=str(device), steps=step,
            test_correct=correct, test_total=total, test_acc=correct / total,
            epoch_times=[h["seconds"] for h in history], history=history))
    # DDP holds the process group: drop it first, so that leaving the group ends gloo's threads
    # now, not at interpreter exit (where torch 2.11 can abort or hang)
    del model, optimizer
    helpers.teardown()


if __name__ == "__main__":   # spawn re-imports this file in each child: guard the launch
    p = helpers.script_parser(__doc__, distributed=True)
    p.add_argument("--nprocs", type=int, default=max(helpers.num_gpus(), 2), help="ranks")
    args = p.parse_args()
    if args.nprocs < 1:
        p.error(f"--nprocs must be at least 1, got {args.nprocs}")
    args = helpers.resolve_args(args, args.nprocs, args.nprocs, parser=p)
    mp.spawn(main, args=(args.nprocs, helpers.free_port(), args), nprocs=args.nprocs)
