"""Part VII: context parallelism (the sequence split over ranks): ring attention by hand
(scratch), PyTorch's context_parallel (torch_api), the chapter's experiments (experiments)."""
from .scratch import (CPAttention, RingAttention, attention_reference, block_attention,
                      block_work, merge_blocks, ring_attention, shard_sequence,
                      split_positions, unshard_sequence)
from .torch_api import context_parallel_status, torch_context_parallel
from .experiments import (cp_activation_memory, cp_attention_run, cp_chapter, cp_torch_run,
                          qkv_inputs, autograd_saved_bytes)

__all__ = ["CPAttention", "RingAttention", "attention_reference", "block_attention",
           "block_work", "merge_blocks", "ring_attention", "shard_sequence", "split_positions",
           "unshard_sequence", "context_parallel_status", "torch_context_parallel",
           "cp_activation_memory", "cp_attention_run", "cp_chapter", "cp_torch_run", "qkv_inputs",
           "autograd_saved_bytes"]
