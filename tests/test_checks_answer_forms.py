"""Answers in a form the exercise text allows: merge_attention's pair as a list (as
weight_grads takes one), and save_matmuls' rejection of OpOverload-vs-packet comparisons naming
what `op` is; forms it does not: ring_allreduce's counts in an array or a tensor where the text
asks a list, named as such (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, ring_over, shortcut
from torch.utils.checkpoint import CheckpointPolicy


@other("check_merge_attention", "the pair as a list [o, lse]")
def merge_attention_list(o1, l1, o2, l2):
    lse = torch.logaddexp(l1, l2)
    return [torch.exp(l1 - lse)[..., None] * o1 + torch.exp(l2 - lse)[..., None] * o2, lse]


@shortcut("check_save_matmuls", "op compared with the packets, never equal: nothing saved",
          ["OpOverload", "aten.mm.default"])
def save_matmuls_packets(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _ring(data):
    """A right ring all-reduce in place; the elements each device sent, as a list."""
    return ring_over(data, [t.view(-1).tensor_split(len(data)) for t in data])


@shortcut("check_ring_allreduce", "the counts in a numpy array (the text asks a list)",
          "return a list (not a numpy array)")
def ring_allreduce_numpy_counts(data):
    return np.array(_ring(data))


@shortcut("check_ring_allreduce", "the counts in a tensor (the text asks a list)",
          "return a list (not a tensor)")
def ring_allreduce_tensor_counts(data):
    return torch.tensor(_ring(data))


test_case = parametrize_cases(__name__)
