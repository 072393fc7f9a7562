"""Part IV: the LeNet the fast trainer compiles on a CPU is Part II's LeNet with less work: the
same logits and gradients, and conv2 computes only the outputs its pool reads."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import helpers
from helpers import (
    FastDataParallel,
    fused_flat_grad,
    init_lenet_params,
    lenet,
    lenet_fused,
    replica_flat_grad,
    tap_major,
)

CPU = torch.device("cpu")


def batch(n, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, 28, 28, generator=g, dtype=dtype)
    return X, torch.randint(0, 10, (n,), generator=g)


def params(seed=0, scale=0.3, dtype=torch.float64):
    """LeNet's shapes at a scale where about half of the ReLUs are on, so a wrong mask shows;
    in float64, so the two functions must agree far below float32's rounding."""
    p = init_lenet_params(scale=scale, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    return [(t if t.dim() > 1 else 0.1 * torch.randn(t.shape, generator=g)).to(dtype) for t in p]


@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_lenet_fused_computes_lenet(n):
    X, _ = batch(n)
    p = params()
    torch.testing.assert_close(lenet_fused(X, tap_major(p)), lenet(X, p), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_fused_flat_grad_is_replica_flat_grad(n):
    """The same gradients in the same flat layout (conv1's weight back in its own order)."""
    X, y = batch(n, seed=n)
    p = params(seed=n)
    g_ref, l_ref = replica_flat_grad(X, y, p)
    g, l = fused_flat_grad(X, y, tap_major(p))
    assert g.shape == g_ref.shape == (helpers.num_params(p),)
    torch.testing.assert_close(l, l_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)
    if n:
        assert g_ref[:180].abs().max() > 1e-3, "conv1's gradient must be tested, not zero"


def test_in_float32_they_differ_by_rounding_only():
    X, y = batch(32, dtype=torch.float32)
    p = params(dtype=torch.float32)
    g_ref, _ = replica_flat_grad(X, y, p)
    g, _ = fused_flat_grad(X, y, tap_major(p))
    assert (g - g_ref).abs().max() <= 1e-5 * g_ref.abs().max()


def test_the_image_outside_the_26x26_corner_changes_nothing():
    """What the fused LeNet leaves out: the last two rows and columns of the image reach no
    output of LeNet (the pools floor them away)."""
    X, _ = batch(4)
    X2 = X.clone()
    X2[:, :, 26:, :] = 5.0
    X2[:, :, :, 26:] = -5.0
    p = params()
    torch.testing.assert_close(lenet(X2, p), lenet(X, p), rtol=0, atol=0)
    torch.testing.assert_close(lenet_fused(X2, tap_major(p)), lenet_fused(X, tap_major(p)),
                               rtol=0, atol=0)


@pytest.mark.parametrize("side", [26, 32])
def test_images_of_another_size_are_refused_not_cropped(side):
    """lenet fails on 32x32 images (its dense layer wants 800 features); the fused LeNet's
    fixed crops would compute something, so it refuses any size but 28x28, and says what to use."""
    X, y = batch(2)
    X = torch.nn.functional.interpolate(X, size=(side, side))
    p = params()
    for call in (lambda: lenet_fused(X, tap_major(p)),
                 lambda: fused_flat_grad(X, y, tap_major(p))):
        with pytest.raises(ValueError, match="28x28 images"):
            call()


def _conv_flops(fn, X, p):
    with FlopCounterMode(display=False) as counter:
        fn(X, p)
    return counter.get_flop_counts()["Global"].get(torch.ops.aten.convolution, 0)


def test_conv2_computes_only_what_its_pool_reads():
    n = 16
    X, _ = batch(n)
    p = params()
    conv1 = 2 * n * 20 * 26 * 26 * 9               # multiply-adds of 26x26 outputs, 1 channel
    conv2 = 2 * n * 50 * 500                        # per output position: 20 channels x 5x5
    assert _conv_flops(lenet, X, p) == conv1 + conv2 * 9 * 9
    assert _conv_flops(lenet_fused, X, tap_major(p)) == conv2 * 8 * 8, (
        "conv2 of the fused LeNet computes its 8x8 kept outputs (conv1 is multiply-adds)")


def test_tap_major_is_a_contiguous_copy():
    p = params()
    t = tap_major(p)
    assert t[0].shape == (9, 20) and t[0].is_contiguous()
    assert torch.equal(t[0][3 * 1 + 2], p[0][:, 0, 1, 2])   # tap (1, 2) of every channel
    assert all(a is b for a, b in zip(t[1:], p[1:])), "the other parameters, as they are"


def test_the_compiled_cpu_step_compiles_the_fused_lenet(monkeypatch):
    """compile=True on a CPU hands torch.compile `fused_flat_grad`; on failure it falls back
    to the plain arithmetic, bitwise the uncompiled step's."""
    compiled = []

    def record(fn, *a, **kw):
        compiled.append(fn)
        return fn
    monkeypatch.setattr(torch, "compile", record)
    X, y = batch(40, dtype=torch.float32)
    p0 = init_lenet_params(seed=1)
    eager = FastDataParallel(p0, [CPU], 0.2, X, y)
    comp = FastDataParallel(p0, [CPU], 0.2, X, y, compile=True)
    idx = torch.arange(40)
    eager.step(idx)
    comp.step(idx)
    assert compiled == [fused_flat_grad]
    assert helpers.max_diff(eager.params[0], comp.params[0]) < 1e-6
    assert helpers.max_diff(eager.params[0], p0) > 1e-4, "the step must move the parameters"
