"""Step 1 of 3: train LeNet on Fashion-MNIST in ONE process. The next steps (spawn.py, torchrun.py)
add the lines that make it data-parallel; everything else stays.

    python scripts/ddp/single.py --dry-run   # 2 short epochs on 512 images (CI)
"""
import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import helpers

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--batch-size", type=int, default=256)
p.add_argument("--lr", type=float, default=0.2)
p.add_argument("--subset", type=int, default=None, help="first N training images (None: all)")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--dry-run", action="store_true", help="CI size: 2 short epochs on 512 images")
p.add_argument("--save", default=None, help="save the model's state_dict here")
p.add_argument("--metrics", default=None, help="write a JSON summary here")
args = p.parse_args()
if args.dry_run:
    args.epochs, args.subset, args.batch_size = 2, 512, 64

device = helpers.try_gpu()
print(f"1 process on {device}")

# --- data: the whole training set, reshuffled each epoch ---
X, y = helpers.load_tensors(True, args.subset)
X_test, y_test = helpers.load_tensors(False, args.subset)
train_set = TensorDataset(X, y)
train_iter = DataLoader(train_set, args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))

# --- model ---
torch.manual_seed(args.seed)
model = helpers.lenet_module().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
loss_fn = nn.CrossEntropyLoss()

step, times = 0, []
for epoch in range(args.epochs):
    t0 = time.perf_counter()
    loss_sum = torch.zeros(2, device=device)
    for Xb, yb in train_iter:
        Xb, yb = Xb.to(device), yb.to(device)
        loss = loss_fn(model(Xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += torch.stack([loss.detach() * len(yb), torch.tensor(len(yb), device=device)])
        step += 1
    correct, total = helpers.evaluate_exact(model, X_test, y_test, device)
    helpers.synchronize(device)
    times.append(time.perf_counter() - t0)
    print(f"epoch {epoch + 1}: train loss {(loss_sum[0] / loss_sum[1]).item():.3f}, "
          f"test acc {correct / total:.3f} on {total} images, {times[-1]:.2f} s")

if args.save:
    torch.save(model.state_dict(), args.save)
if args.metrics:
    with open(args.metrics, "w") as f:
        json.dump(dict(world_size=1, device=str(device), steps=step, test_correct=correct,
                       test_total=total, test_acc=correct / total, epoch_times=times), f)
