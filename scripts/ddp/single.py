"""Step 1 of 3: train LeNet on Fashion-MNIST in ONE process. The next steps (spawn.py, torchrun.py)
add the lines that make it data-parallel; everything else stays.

    python scripts/ddp/single.py --dry-run                  # 2 short epochs on 512 images (CI)
    python scripts/ddp/single.py --snapshot run.pt          # stop it any time, run it again:
                                                            # it continues where it stopped
Every argument is checked before any work is done; --dry-run only fills in what was not given.
"""
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import helpers

p = helpers.script_parser(__doc__)
args = helpers.resolve_args(p.parse_args(), parser=p)

device = helpers.try_gpu()
print(f"1 process on {device}")

# --- data: the whole training set, reshuffled each epoch (the order depends on seed + epoch) ---
X, y = helpers.load_tensors(True, args.subset)
X_test, y_test = helpers.load_tensors(False, args.subset)
train_set = TensorDataset(X, y)
sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
train_iter = DataLoader(train_set, args.batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")   # copies that need no wait

# --- model ---
torch.manual_seed(args.seed)
helpers.exact_float32()   # the same float32 maths as the DDP runs it is compared with
model = helpers.lenet_module().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
loss_fn = nn.CrossEntropyLoss()

# --- resume: model, optimizer, next epoch and RNG states from the last snapshot ---
start, history = 0, []
if args.snapshot and os.path.exists(args.snapshot):
    start, history = helpers.load_snapshot(args.snapshot, model, optimizer, lr=args.lr)
    print(f"resuming from {args.snapshot} at epoch {start + 1}")

step = start * len(train_iter)
for epoch in range(start, args.epochs):
    sampler.set_epoch(epoch)
    t0 = helpers.synced_now(device)
    loss_sum = torch.zeros(2, device=device)   # (sum of losses, examples) on the device
    for Xb, yb in train_iter:
        Xb, yb = Xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        loss = loss_fn(model(Xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum[0] += loss.detach() * len(yb)
        loss_sum[1] += len(yb)
        step += 1
    rank_sums = [loss_sum]
    correct, total = helpers.evaluate_exact(model, X_test, y_test, device)
    history.append(dict(epoch=epoch + 1, loss=(loss_sum[0] / loss_sum[1]).item(),
                        rank_losses=[(s[0] / s[1]).item() for s in rank_sums],
                        test_acc=correct / total, seconds=helpers.synced_now(device) - t0,
                        attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))))
    print(f"epoch {epoch + 1}: train loss {history[-1]['loss']:.3f}, "
          f"test acc {correct / total:.3f} on {total} images, {history[-1]['seconds']:.2f} s")
    if args.snapshot:
        helpers.save_snapshot_all(args.snapshot, model, optimizer, epoch + 1, history)

correct, total = helpers.evaluate_exact(model, X_test, y_test, device)   # the final model
if args.save:
    helpers.save_checkpoint(model, args.save)   # atomically: a kill mid-save keeps the old file
if args.metrics:
    helpers.write_json(args.metrics, dict(
        world_size=1, device=str(device), steps=step, test_correct=correct, test_total=total,
        test_acc=correct / total, epoch_times=[h["seconds"] for h in history], history=history))
