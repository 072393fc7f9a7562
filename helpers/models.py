"""The course's models: LeNet written functionally (Part II), as modules, and a small ResNet-18."""
import sys

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["LENET_SHAPES", "init_lenet_params", "lenet", "lenet_module", "loss", "num_params",
           "resnet18", "unwrap"]

# Shapes of the reference LeNet's parameters: two convolutions, two dense layers, with biases.
LENET_SHAPES = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]

loss = nn.CrossEntropyLoss(reduction="none")   # per-example losses; the trainer decides the scale


def init_lenet_params(scale=0.01, seed=None):
    """LeNet's parameters: weights ~ N(0, scale^2), biases 0 (129,068 numbers in all)."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return [torch.randn(s, generator=g) * scale if len(s) > 1 else torch.zeros(s)
            for s in LENET_SHAPES]


def lenet(X, params):
    """Forward pass of the reference LeNet on X of shape (n, 1, 28, 28); returns (n, 10) logits."""
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, W2, b2)), kernel_size=2, stride=2)
    h2 = h2.flatten(1)   # not reshape(n, -1): that fails for an empty shard (n = 0)
    h3 = F.relu(torch.mm(h2, W3) + b3)   # W3 is (in, out), so mm, not F.linear
    return torch.mm(h3, W4) + b4


def num_params(params):
    """How many numbers a list of tensors (or a module) holds."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    return sum(p.numel() for p in params)


def lenet_module():
    """The same LeNet as an nn.Module (for the concise chapters); no lazy layers, so a fresh
    instance after torch.manual_seed always starts from the same weights."""
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))


class Residual(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with BatchNorm and a shortcut."""

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(out_channels), nn.BatchNorm2d(out_channels)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        return F.relu(Y + (X if self.shortcut is None else self.shortcut(X)))


def resnet18(num_classes=10, in_channels=1, width=64):
    """ResNet-18 sized for 28x28 images (3x3 stem, no max-pool), as in the reference's concise
    chapter. `width` scales the channels; 64 is the standard model (about 11 M parameters)."""
    def stage(cin, cout, first):
        return nn.Sequential(Residual(cin, cout, stride=1 if first else 2), Residual(cout, cout))

    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
        stage(w, w, True), stage(w, 2 * w, False), stage(2 * w, 4 * w, False),
        stage(4 * w, 8 * w, False),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, num_classes))


def _inner(model):
    """The model a known wrapper holds, or None: torch's DataParallel,
    DistributedDataParallel and FSDP (`.module`), torch.compile's module (`._orig_mod`), and
    the course's wrappers, marked by the class attribute `wraps_module = True` (`.module`)."""
    if getattr(type(model), "wraps_module", False) is True or isinstance(
            model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    compiled = sys.modules.get("torch._dynamo.eval_frame")     # none compiled before its import
    if compiled is not None and isinstance(model, compiled.OptimizedModule):
        return model._orig_mod
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and isinstance(model, fsdp.FullyShardedDataParallel):
        return model.module
    return None


def unwrap(model):
    """The model inside its wrappers, however many (_inner: the known wrapper types only; a
    model whose own submodule is called `module` is not a wrapper). The one unwrapping of the
    course (saving, loading, reading parameters); a model without a wrapper comes back as it
    is."""
    while isinstance(inner := _inner(model), nn.Module) and inner is not model:
        model = inner
    return model
