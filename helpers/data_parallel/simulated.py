"""Part II: data parallelism from scratch on simulated or real devices, in one process: copy
the parameters, split a batch, sum the gradients (get_params, split_batch, allreduce), and the
training loop built on them (train_batch, train), with evaluation.
"""
import torch

from ..config import choose
from ..data import load_data_fashion_mnist
from ..devices import Timer, get_devices
from ..models import init_lenet_params, lenet, loss
from ..plotting import Animator, progress
from ..validate import validate_lr, validate_positive_int, validate_seed, validate_step
from ..words import plural

__all__ = ["get_params", "allreduce", "split_batch", "sgd", "train_batch", "train",
           "evaluate_accuracy", "default_run_size"]


def get_params(params, device):
    """Independent, trainable copies of `params` on `device`.

    Always copies, even when `device` is where `params` already live: `p.to(device)` on the same
    device returns the SAME tensor, and two "replicas" sharing storage double their gradients.
    """
    new_params = [p.detach().to(device, copy=True) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params


def allreduce(data):
    """Sum a list of tensors (on any mix of devices) in place: afterwards each holds the sum.

    In place matters: the tensors are the replicas' `.grad`s. Rebinding a list item
    (`data[i] = data[0].to(...)`) would leave the replicas' own gradients unchanged.
    """
    if not data:
        raise ValueError("allreduce needs at least one tensor")
    for i in range(1, len(data)):
        data[0].add_(data[i].to(data[0].device))
    for i in range(1, len(data)):
        data[i].copy_(data[0])   # copy_ moves across devices and writes into data[i]'s storage


def split_batch(X, y, devices):
    """Split X and y into len(devices) paired shards, one on each device.

    Shard sizes differ by at most one (torch.tensor_split). A batch smaller than the number of
    devices (an epoch's short last batch) leaves some shards empty: those replicas add a zero
    gradient, and the sum over devices is still the whole batch's. `nn.parallel.scatter` would
    need CUDA.
    """
    k = len(devices)
    if k == 0:
        raise ValueError("no devices given: pass at least one, e.g. helpers.get_devices(1)")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}; they must pair up")
    return ([x.to(d) for x, d in zip(X.tensor_split(k), devices)],  # noqa: B905
            [t.to(d) for t, d in zip(y.tensor_split(k), devices)])  # noqa: B905


def sgd(params, lr, batch_size):
    """Minibatch SGD on summed losses: divide by the batch size here, then clear the gradients."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def train_batch(X, y, device_params, devices, lr):
    """One data-parallel SGD step on a minibatch; returns the summed loss (on devices[0]).

    Convention: each shard's loss is summed, gradients are all-reduced (summed), and sgd divides by
    the GLOBAL batch size, which equals the gradient of the mean loss over the whole batch.
    A batch smaller than the number of devices leaves some shards empty (zero gradients there).
    """
    validate_step(X, y, device_params, devices, lr)   # before any replica computes or steps
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, W), y_shard).sum()
          for X_shard, y_shard, W in zip(X_shards, y_shards, device_params)]  # noqa: B905
    for l in ls:   # backward runs on each device separately
        l.backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:   # every replica takes the same step
        sgd(param, lr, X.shape[0])
    return sum(l.detach().to(devices[0]) for l in ls)


def evaluate_accuracy(net, data_iter, device):
    """Fraction of correct predictions of `net` (a callable on X) over `data_iter`, on `device`.

    A module is put in eval mode meanwhile (BatchNorm then uses its running statistics)."""
    was_training = isinstance(net, torch.nn.Module) and net.training
    if was_training:
        net.eval()
    correct, total = torch.zeros((), device=device), 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            correct += (net(X).argmax(dim=1) == y).sum()
            total += y.numel()
    if was_training:
        net.train()
    return correct.item() / total


def train(num_gpus, batch_size, lr, num_epochs=10, subset=None, seed=0, plot=True):
    """Train the functional LeNet on Fashion-MNIST on `num_gpus` devices (simulated if missing).

    Returns a dict with the final test accuracy, median seconds per epoch (epochs 2 onwards, the
    first pays for warm-up), every step's mean training loss and the trained parameters. An
    epoch's last batch may be shorter than the device count: it is trained on, some devices
    getting an empty shard.
    """
    validate_positive_int(num_gpus, "num_gpus")
    validate_positive_int(batch_size, "batch_size")
    validate_positive_int(num_epochs, "num_epochs")
    validate_positive_int(subset, "subset", allow_none=True)
    validate_lr(lr)
    validate_seed(seed)
    devices = get_devices(num_gpus)
    train_iter, test_iter = load_data_fashion_mnist(batch_size, subset=subset, seed=seed)
    device_params = [get_params(init_lenet_params(seed=seed), d) for d in devices]
    animator = Animator(xlabel="epoch", xlim=[1, num_epochs], ylim=[0, 2.5],
                        legend=["train loss", "test acc"]) if plot else None
    timer, n, step_losses = Timer(devices), len(train_iter.dataset), []
    for epoch in range(num_epochs):
        timer.start()
        total_loss = torch.zeros((), device=devices[0])
        for X, y in progress(train_iter, desc=f"epoch {epoch + 1}"):
            summed = train_batch(X, y, device_params, devices, lr)
            total_loss += summed
            step_losses.append(summed / len(y))   # kept on the device: no wait
        timer.stop()
        test_acc = evaluate_accuracy(lambda X: lenet(X, device_params[0]), test_iter, devices[0])
        if animator:
            animator.add(epoch + 1, (total_loss.item() / n, test_acc))
    sec = timer.median(skip=1)
    print(f"{plural(num_gpus, 'device')}: test acc {test_acc:.3f}, {sec:.2f} s/epoch "
          f"on {[str(d) for d in devices]}")
    return dict(num_gpus=num_gpus, test_acc=test_acc, sec_per_epoch=sec,
                epoch_times=timer.times,
                step_losses=torch.stack(step_losses).tolist(),
                params=device_params[0])


def default_run_size():
    """Sizes for train(**sizes): the prose's 10 epochs on all data at lr 0.2 (the reference's);
    on a CPU 4 epochs of 25,600 images at lr 0.5, because the 0.01-initialised LeNet sits near
    chance for its first few hundred steps at 0.2 and 400 steps would not get past them (0.5
    reaches about 0.74; 0.9 diverges); in quick mode 2 tiny epochs (CI: a unit test checks
    learning)."""
    return choose(dict(num_epochs=10, subset=None, lr=0.2),
                  dict(num_epochs=4, subset=25600, lr=0.5),
                  what="LeNet training", tiny=dict(num_epochs=2, subset=1280, lr=0.5))
