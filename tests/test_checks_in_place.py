"""Exercises that change the tensors they are handed in place are judged on those tensor objects,
kept aside before the call (helpers/checks/_core/handed.py: `kept_aside`, `in_place`), never on
the list read back: the caller (a model's p.grad) holds the tensors, so an answer that rebinds
the list's entries leaves the caller's tensors wrong (tests/check_cases.py)."""
import torch
import torch.distributed as dist
from check_cases import dp_group, other, parametrize_cases, shortcut

REPLACED = "was replaced by a new tensor"


@shortcut("check_dp_average", "rebinds each entry to the average", [f"grads[0] {REPLACED}",
                                                                    "the caller holds"])
def dp_average_rebinds_entries(grads, comm):
    for i, g in enumerate(grads):
        comm.all_reduce(g)
        grads[i] = g / comm.world


@shortcut("check_dp_average", "rebinds the whole list's contents", f"grads[0] {REPLACED}")
def dp_average_slice_assigns(grads, comm):
    for g in grads:
        comm.all_reduce(g)
    grads[:] = [g / comm.world for g in grads]


@other("check_dp_average", "rebinds each entry to the same tensor, averaged in place")
def dp_average_rebinds_to_itself(grads, comm):
    for i, g in enumerate(grads):
        dist.all_reduce(g, group=dp_group(comm))
        grads[i] = g.div_(comm.world)


@shortcut("check_average_bucket", "rebinds the list's contents to averaged slices",
          f"grads[0] {REPLACED}")
def average_bucket_slice_assigns(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    grads[:] = [p.view_as(g) for p, g in zip(flat.split([g.numel() for g in grads]), grads)]


@shortcut("check_ring_allreduce", "rebinds the list's entries to the sum",
          f"data[0] {REPLACED}")
def ring_allreduce_rebinds(data):
    total = torch.stack(list(data)).sum(0)
    for i in range(len(data)):
        data[i] = total.clone()
    return [0] * len(data)


test_case = parametrize_cases(__name__)
