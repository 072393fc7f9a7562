"""Natural wrong answers that read a neighbouring quantity, once right on every draw because the
check's inputs made the two equal: a view's storage for its bytes (check_tensor_bytes drew only
fresh tensors), a layer's output for the activations it keeps (check_largest_batch_data_parallel
drew `out` equal to `acts`), every device summing all gradients for itself instead of one
reduction and a broadcast (check_reduce_then_broadcast counted no additions). Each fails on
several replayed draws; the right answers beside them pass (tests/check_cases.py)."""
import pytest
import torch
from check_cases import other, parametrize_cases, shortcut

from helpers import OPTIMIZER_STATE_BYTES
from helpers.checks import (
    check_largest_batch_data_parallel,
    check_reduce_then_broadcast,
    check_tensor_bytes,
)
from helpers.checks._core.inputs import replay_seeds


@shortcut("check_tensor_bytes", "each storage's bytes (untyped_storage().nbytes())",
          "the bytes of their storages")
def tensor_bytes_untyped_storage(tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


@shortcut("check_tensor_bytes", "a typed storage's size times the element size",
          "the bytes of their storages")
def tensor_bytes_typed_storage(tensors):
    return sum(t.untyped_storage().nbytes() // t.element_size() * t.element_size()
               for t in tensors)


@other("check_tensor_bytes", "each tensor cloned dense, its storage's bytes")
def tensor_bytes_cloned(tensors):
    return sum(t.clone().untyped_storage().nbytes() for t in tensors)


@shortcut("check_largest_batch_data_parallel", "the layers' outputs for their activations",
          "not their outputs")
def largest_batch_outputs(sizes, k, memory_bytes, optimizer):
    P = sum(r["params"] for r in sizes)
    A = sum(r["out"] for r in sizes)
    fixed = (8 + OPTIMIZER_STATE_BYTES[optimizer]) * P
    return k * max(0, (memory_bytes - fixed) // (4 * A))


@other("check_largest_batch_data_parallel", "examples counted up one at a time")
def largest_batch_counted(sizes, k, memory_bytes, optimizer):
    P = sum(r["params"] for r in sizes)
    per_example = 4 * sum(r["acts"] for r in sizes)
    left = memory_bytes - (8 + OPTIMIZER_STATE_BYTES[optimizer]) * P
    n = 0
    while left >= per_example:
        left, n = left - per_example, n + 1
    return k * n


@shortcut("check_reduce_then_broadcast", "every device sums all gradients for itself",
          "sum the gradients once")
def reduce_then_broadcast_all_pull(grads):
    snapshot = [g.clone() for g in grads]
    for i, g in enumerate(grads):
        for j, h in enumerate(snapshot):
            if j != i:
                g.add_(h.to(g.device))


@other("check_reduce_then_broadcast", "torch.stack on device 0, summed, then copied back")
def reduce_then_broadcast_stack(grads):
    total = torch.stack([g.to(grads[0].device) for g in grads]).sum(0)
    for g in grads:
        g.copy_(total)


test_case = parametrize_cases(__name__)


@pytest.mark.parametrize("check, wrong", [
    (check_tensor_bytes, tensor_bytes_untyped_storage),
    (check_largest_batch_data_parallel, largest_batch_outputs),
    (check_reduce_then_broadcast, reduce_then_broadcast_all_pull)])
def test_the_mistake_fails_on_every_draw(check, wrong):
    for seed in range(5000, 5005):     # conftest replays its own seeds again after the test
        replay_seeds(seed)
        assert check(wrong).status == "failed", seed
