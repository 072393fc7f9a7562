"""Part VII: context parallelism (the sequence split over ranks): ring attention by hand
(scratch), all-to-all attention over the heads (ulysses), PyTorch's context_parallel
(torch_api), the chapter's experiments (experiments; what they return: results)."""
from .experiments import (
                      cp_activation_memory,
                      cp_attention_run,
                      cp_torch_run,
                      cp_ulysses_run,
                      qkv_inputs,
)
from .scratch import (
                      CPAttention,
                      RingAttention,
                      RingCensus,
                      attention_reference,
                      block_attention,
                      block_work,
                      causal_block,
                      merge_blocks,
                      ring_attention,
                      ring_pass,
                      shard_sequence,
                      split_positions,
                      unshard_sequence,
                      validate_ranks_agree,
)
from .torch_api import ROTATE_METHODS, context_parallel_status, torch_context_parallel
from .ulysses import HeadsToSeq, SeqToHeads, heads_to_seq, seq_to_heads, ulysses_attention

__all__ = ["CPAttention", "RingAttention", "RingCensus", "attention_reference",
           "block_attention", "block_work", "causal_block", "validate_ranks_agree",
           "merge_blocks", "ring_attention", "ring_pass", "shard_sequence", "split_positions",
           "unshard_sequence", "HeadsToSeq", "SeqToHeads", "heads_to_seq", "seq_to_heads",
           "ulysses_attention", "ROTATE_METHODS", "context_parallel_status",
           "torch_context_parallel", "cp_activation_memory", "cp_attention_run",
           "cp_torch_run", "cp_ulysses_run", "qkv_inputs"]
