"""Part VI: tensor parallelism with DTensor: the parallelize_module plan for the SmallBlock
(ColwiseParallel / RowwiseParallel, as the from-scratch split); runtime.traffic.FuncolBytes
counts the bytes its collectives carry.
"""
__all__ = ["tp_plan"]


def tp_plan(block=True, prepare_input=True):
    """The parallelize_module plan for the SmallBlock (or for a SmallMLP alone: block=False).
    prepare_input: turn the attention's input into one replicated DTensor, so q, k and v share
    it and backward all-reduces its gradient once, not once per projection."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel)
    if not block:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    if prepare_input:
        plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                          desired_input_layouts=(Replicate(),),
                                          use_local_output=False)
        plan["mlp"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                         desired_input_layouts=(Replicate(),),
                                         use_local_output=False)
    return plan


