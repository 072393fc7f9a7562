"""A collective's buffers take the input's dtype, as gloo and NCCL require: the World refuses a
gather or reduce-scatter into a buffer of another dtype (helpers/checks/_core/buffers.py), and
check_gather_layer and check_grad_shard hand one case a bfloat16 shard (FSDP's compute dtype,
mixed precision's gradients) and want the result back in it; buffers made from the input, and a
reduce-scatter run in float32 and cast back, pass (tests/check_cases.py)."""
import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

from helpers.checks._core import CheckFailed
from helpers.checks._core.world import World

BUFFER = "refuses a buffer whose dtype or device is not the input's"
RESULT = "for a torch.bfloat16 input"


def _split(full, shapes):
    sizes = [s.numel() for s in shapes]
    return [t.view(s) for t, s in zip(full[:sum(sizes)].split(sizes), shapes, strict=True)]


# ---- gather_layer --------------------------------------------------------------------------------
@shortcut("check_gather_layer", "the output made by torch.empty (float32)", [BUFFER, "new_empty"])
def gather_default_dtype(shard, shapes):
    full = torch.empty(shard.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(full, shard)
    return _split(full, shapes)


@shortcut("check_gather_layer", "a list of torch.zeros buffers (float32)", BUFFER)
def gather_list_default(shard, shapes):
    parts = [torch.zeros(shard.numel()) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard)
    return _split(torch.cat(parts), shapes)


@shortcut("check_gather_layer", "gathered in the shard's dtype, returned as float32", RESULT)
def gather_returned_float(shard, shapes):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(full, shard)
    return [t.float() for t in _split(full, shapes)]


@other("check_gather_layer", "a list of buffers made with the shard's dtype and device")
def gather_list_like(shard, shapes):
    parts = [torch.empty(shard.numel(), dtype=shard.dtype, device=shard.device)
             for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard)
    return _split(torch.cat(parts), shapes)


# ---- grad_shard ----------------------------------------------------------------------------------
@shortcut("check_grad_shard", "pad and output made by torch.zeros and torch.empty (float32)",
          [RESULT, "new_zeros"])
def grad_shard_default_dtype(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, torch.zeros(-flat_grad.numel() % world)])
    out = torch.empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


@shortcut("check_grad_shard", "pad by new_zeros, output by torch.empty (float32)", BUFFER)
def grad_shard_default_output(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = torch.empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


@shortcut("check_grad_shard", "list form into a float64 buffer", BUFFER)
def grad_shard_list_float64(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = torch.empty(flat.numel() // world, dtype=torch.float64)
    dist.reduce_scatter(out, list(flat.chunk(world)))
    return (out / world).to(flat_grad.dtype)


@other("check_grad_shard", "reduce-scattered in float32, cast back to the gradient's dtype")
def grad_shard_in_float32(flat_grad):
    world = dist.get_world_size()
    flat = torch.nn.functional.pad(flat_grad.float(), (0, -flat_grad.numel() % world))
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return (out / world).to(flat_grad.dtype)


@pytest.mark.parametrize("call", ["all_gather_into_tensor", "all_gather", "reduce_scatter",
                                  "reduce_scatter_tensor"])
def test_the_world_refuses_a_buffer_of_another_dtype_even_caught(call):
    """Caught in the rank, the refusal still fails the run (the network's failure is kept)."""
    def fn(comm):
        x = torch.ones(4, dtype=torch.bfloat16)
        try:
            if call == "all_gather_into_tensor":
                dist.all_gather_into_tensor(torch.empty(8), x)
            elif call == "all_gather":
                dist.all_gather([torch.empty(4), torch.empty(4)], x)
            elif call == "reduce_scatter":
                dist.reduce_scatter(torch.empty(2), list(x.chunk(2)))
            else:
                dist.reduce_scatter_tensor(torch.empty(2), x)
        except CheckFailed:
            pass
        return 0
    with pytest.raises(CheckFailed, match=BUFFER):
        World(2, allow={"all_gather", "reduce_scatter"}).run(fn)


test_case = parametrize_cases(__name__)
