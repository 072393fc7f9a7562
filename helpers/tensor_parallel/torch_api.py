"""Part VI: tensor parallelism with DTensor: the parallelize_module plan for the SmallBlock
(ColwiseParallel / RowwiseParallel, as the from-scratch split); runtime.traffic.FuncolBytes
counts the bytes its collectives carry.
"""
__all__ = ["tp_plan", "sp_plan", "vocab_plan"]


def tp_plan(block=True, prepare_input=True):
    """The parallelize_module plan for the SmallBlock (or for a SmallMLP alone: block=False).
    prepare_input: turn the attention's input into one replicated DTensor, so q, k and v share
    it and backward all-reduces its gradient once, not once per projection."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )
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




def sp_plan():
    """tp_plan with sequence parallelism: the layer norms run on this rank's positions
    (SequenceParallel); attention and the MLP gather the sequence on the way in
    (PrepareModuleInput Shard(1) -> Replicate) and reduce-scatter it on the way out
    (RowwiseParallel(output_layouts=Shard(1)))."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )
    gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
            "attn": PrepareModuleInput(**gather), "mlp": PrepareModuleInput(**gather),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1))}


def vocab_plan():
    """The TinyTPLM's vocabulary split: the embedding's rows (RowwiseParallel on an
    nn.Embedding: each rank looks up its ids, an all-reduce sums them) and the head's output
    columns, kept as a DTensor sharded on the vocabulary for loss_parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {f"block.{k}": v for k, v in tp_plan(True, True).items()}
    plan["emb"] = RowwiseParallel(input_layouts=Replicate())   # every rank has all the ids
    plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan
