"""Part IV: LeNet's forward and backward as the fast trainer compiles them on a CPU. The same
function as `models.lenet` (same logits, same gradients, within float rounding), with two kinds
of work left out:

- what the pools throw away: a 2x2 average pool with stride 2 floors an odd size, so conv2's
  9x9 output loses its last row and column before anything reads it. conv2 needs only the 12x12
  corner of its 13x13 input (8x8 outputs: a fifth less of LeNet's largest layer, forward and
  backward), and conv1 only the 26x26 corner of the image;
- conv1's memory traffic: a 3x3 convolution of ONE input channel is 9 multiply-adds per output,
  too little arithmetic for a convolution library, which spends its time writing the 20 channels
  of 24x24 outputs and reading them back. Written as 9 shifted multiply-adds with the ReLU and
  the pool (`conv1_relu_pool`), it is one loop for the compiler, which reads the image and
  writes the pooled 12x12. Its gradient is written by hand (`conv1_grads`): autograd would keep
  the pre-activations for the backward; recomputing them costs 9 multiply-adds.

`fused_flat_grad` takes conv1's weights tap-major, (9, 20) (`tap_major` makes them): the
compiler then loads 20 channels' weights as one vector. It returns the gradient in the flat
layout of `replica_flat_grad`, so the fast step's allreduce and update do not change.
"""
import torch
from torch.nn import functional as F

from ..models import loss

__all__ = ["conv1_relu_pool", "conv1_grads", "lenet_fused", "fused_flat_grad", "tap_major",
           "untap"]

TAPS = [(a, b) for a in range(3) for b in range(3)]   # conv1's 3x3 kernel, row by row


def _conv1(X, W1t, b1, i0, j0, size, step):
    """conv1's pre-activations at rows i0, i0 + step, ... (`size` of them) and the same columns,
    as 9 shifted multiply-adds: shape (n, size, size, 20), channels last."""
    span = step * (size - 1) + 1
    out = b1
    for k, (a, b) in enumerate(TAPS):
        patch = X[:, i0 + a:i0 + a + span:step, j0 + b:j0 + b + span:step]
        out = out + patch.unsqueeze(-1) * W1t[k]
    return out


def _validate_images(X):
    """The crops above are LeNet's on 28x28 images: any other size would be cropped silently
    where `lenet` fails, so it is refused."""
    if X.shape[-2:] != (28, 28):
        raise ValueError(f"lenet_fused computes LeNet on 28x28 images, got "
                         f"{tuple(X.shape[-2:])}: use helpers.lenet (or FastDataParallel "
                         "without compile) for other sizes")


def conv1_relu_pool(X, W1t, b1):
    """avg_pool2d(relu(conv2d(X, W1, b1)), 2, 2)[:, :, :12, :12] of a one-channel image X
    (n, 28, 28), channels last: (n, 12, 12, 20). W1t is conv1's weight tap-major, (9, 20).
    Each 2x2 window's 4 corners are conv1 at stride 2 from a corner."""
    _validate_images(X)
    pooled = 0
    for di in range(2):
        for dj in range(2):
            pooled = pooled + F.relu(_conv1(X, W1t, b1, di, dj, 12, 2))
    return pooled * 0.25


def conv1_grads(X, W1t, b1, grad):
    """The gradients of conv1_relu_pool(X, W1t, b1) for W1t and b1, given `grad`, that of its
    output: the pre-activations recomputed, each pooled gradient spread over its 2x2 window where
    the ReLU let it through, and one product of the 3x3 patches with them."""
    n = X.shape[0]
    pre = _conv1(X, W1t, b1, 0, 0, 24, 1)                                 # (n, 24, 24, 20)
    up = grad[:, :, None, :, None].expand(n, 12, 2, 12, 2, 20).reshape(n, 24, 24, 20)
    G = torch.where(pre > 0, up * 0.25, 0.0).reshape(-1, 20)
    P = torch.stack([X[:, a:a + 24, b:b + 24] for a, b in TAPS], -1).reshape(-1, 9)
    return P.t() @ G, G.sum(0)


def _after_conv1(h1, params):
    """LeNet from conv1's pooled output h1 (n, 12, 12, 20) on: the logits."""
    W2, b2, W3, b3, W4, b4 = params
    h1 = h1.permute(0, 3, 1, 2)                                          # (n, 20, 12, 12)
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, W2, b2)), kernel_size=2, stride=2).flatten(1)
    h3 = F.relu(torch.mm(h2, W3) + b3)
    return torch.mm(h3, W4) + b4


def lenet_fused(X, params):
    """`lenet(X, params)` with conv1's weight tap-major (see `tap_major`), X (n, 1, 28, 28)."""
    W1t, b1, *rest = params
    return _after_conv1(conv1_relu_pool(X[:, 0], W1t, b1), rest)


def tap_major(params):
    """LeNet's parameters with conv1's weight (20, 1, 3, 3) as a contiguous (9, 20) copy."""
    W1, *rest = params
    return [W1.reshape(W1.shape[0], 9).t().contiguous(), *rest]


def untap(W1t):
    """conv1's tap-major weight (or its gradient), (9, 20), back in LeNet's (20, 1, 3, 3)."""
    return W1t.t().reshape(-1, 1, 3, 3)


def _loss_after_conv1(h1, y, params):
    return loss(_after_conv1(h1, params), y).sum()


def fused_flat_grad(X, y, params):
    """`replica_flat_grad(X, y, params)` from `tap_major(params)`: (the flat gradient in LeNet's
    own layout, the summed loss). Autograd differentiates LeNet after conv1, for its parameters
    and for conv1's output; conv1_grads does the rest."""
    W1t, b1, *rest = params
    X = X[:, 0]
    h1 = conv1_relu_pool(X, W1t, b1)
    (g_h1, g_rest), l = torch.func.grad_and_value(_loss_after_conv1, argnums=(0, 2))(h1, y, rest)
    g_W1t, g_b1 = conv1_grads(X, W1t, b1, g_h1)
    grads = [untap(g_W1t), g_b1, *g_rest]
    return torch.cat([g.reshape(-1) for g in grads]), l
