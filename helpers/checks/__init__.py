"""Exercise checks: one module per chapter, named after its notebook (book/part5/zero.ipynb ->
zero.py), on the harness in _core (README.md). A notebook imports
`from helpers.checks import check_...`. Every name is imported explicitly from a module that
lists it in __all__ (tests/test_checks_exports.py keeps the two together)."""
# the harness: what a check is built with and what a grader reads
from ._core import (REGISTRY, CheckFailed, HarnessError, Result, check, expect, fresh_generator,
                    run_check)
# the foundation chapter (book/gpus.ipynb)
from .gpus import (check_copy_time, check_fit_copy_model, check_link_between, check_matmul_flops,
                   check_roofline_time, check_tensor_bytes)
# Part I
from .network_split import (check_interleaved_costs, check_microbatches_for_bubble,
                            check_order_1f1b, check_split_by_params)
from .within_layer import (check_attention_by_heads, check_conv_split_in_channels,
                           check_gated_mlp_column_then_row, check_partial_sum_bytes)
from .data_parallel import (check_accumulated_step, check_bytes_sent_naive_vs_ring,
                            check_combine_mean_grads, check_reduce_then_broadcast,
                            check_sharded_server_step)
from .costs import (check_dp_step_seconds, check_gpipe_time, check_largest_batch_data_parallel,
                    check_saved_bytes)
# Part II
from .scratch import check_allreduce_spread, check_evaluate_accuracy_multi, check_shard_sizes
# Part III
from .dataparallel import check_dp_forward, check_dp_shard_sizes, check_lr_at
from .custom_modules import (check_accumulate_gradients, check_strip_module_prefix,
                             check_unused_parameters)
from .ddp_torchrun import check_rank_loss, check_resume, check_sampler_shard
from .ddp_scratch import (check_average_bucket, check_bucket_params, check_overlap_hooks,
                          check_scratch_accumulate)
from .syncbn import check_global_mean_var, check_sync_bn_input_grad, check_update_running_stats
# Part IV
from .profile import check_predicted_speedup, check_time_it, check_time_shares
from .fixes import check_amdahl_speedup, check_bucket_allreduce, check_ring_allreduce
from .scaling import (check_crossover_bytes, check_fit_latency_bandwidth,
                      check_ring_allreduce_seconds)
# Part V
from .zero import (check_accumulate_zero2, check_grad_shard, check_mixed_zero_bytes,
                   check_partition, check_qwz_all_gather, check_zero1_optimizer)
from .fsdp_scratch import (check_clip_sharded, check_fsdp_units, check_gather_layer,
                           check_shard_flat, check_zero3_sent_bytes)
from .fsdp2 import (check_checkpointed_forward, check_choose_checkpoints, check_dcp_resume,
                    check_save_matmuls, check_saved_bytes_of_call)
# Part VI
from .pipeline_dist import (check_cuts_for_times, check_idle_share, check_microbatches_for,
                            check_pipeline_forward, check_weight_grads)
from .tensor_parallel_dist import (check_megatron_mlp, check_row_parallel_linear,
                                   check_tp_ring_bytes, check_vocab_loss)
from .mesh2d import check_dp_average, check_local_shape, check_mesh_groups
# Part VII
from .context_parallel import (check_half_block, check_merge_attention, check_ring_forward,
                               check_tokens_to_heads, check_zigzag_positions)
from .expert_parallel import (check_balancing_loss, check_dispatch_tokens, check_expert_grad_group,
                              check_keep_within_capacity, check_permute_tokens, check_z_loss)
from .composed import (check_accumulation_bytes, check_activation_bytes, check_mesh_groups_3d,
                       check_tp_bytes_per_step)
from ._core.own import gate  # isort: skip  (after every check module)

gate(__name__)     # the check modules' own functions, out of the answer's reach
del gate

__all__ = ["REGISTRY", "CheckFailed", "HarnessError", "Result", "check", "expect",
           "fresh_generator", "run_check", "check_copy_time", "check_fit_copy_model",
           "check_link_between", "check_matmul_flops", "check_roofline_time", "check_tensor_bytes",
           "check_interleaved_costs", "check_microbatches_for_bubble", "check_order_1f1b",
           "check_split_by_params", "check_attention_by_heads", "check_conv_split_in_channels",
           "check_gated_mlp_column_then_row", "check_partial_sum_bytes", "check_accumulated_step",
           "check_bytes_sent_naive_vs_ring", "check_combine_mean_grads",
           "check_reduce_then_broadcast", "check_sharded_server_step", "check_dp_step_seconds",
           "check_gpipe_time", "check_largest_batch_data_parallel", "check_saved_bytes",
           "check_allreduce_spread", "check_evaluate_accuracy_multi", "check_shard_sizes",
           "check_dp_forward", "check_dp_shard_sizes", "check_lr_at", "check_accumulate_gradients",
           "check_strip_module_prefix", "check_unused_parameters", "check_rank_loss",
           "check_resume", "check_sampler_shard", "check_average_bucket", "check_bucket_params",
           "check_overlap_hooks", "check_scratch_accumulate", "check_global_mean_var",
           "check_sync_bn_input_grad", "check_update_running_stats", "check_predicted_speedup",
           "check_time_it", "check_time_shares", "check_amdahl_speedup", "check_bucket_allreduce",
           "check_ring_allreduce", "check_crossover_bytes", "check_fit_latency_bandwidth",
           "check_ring_allreduce_seconds", "check_accumulate_zero2", "check_grad_shard",
           "check_mixed_zero_bytes", "check_partition", "check_qwz_all_gather",
           "check_zero1_optimizer", "check_clip_sharded", "check_fsdp_units", "check_gather_layer",
           "check_shard_flat", "check_zero3_sent_bytes", "check_checkpointed_forward",
           "check_choose_checkpoints", "check_dcp_resume", "check_save_matmuls",
           "check_saved_bytes_of_call", "check_cuts_for_times", "check_idle_share",
           "check_microbatches_for", "check_pipeline_forward", "check_weight_grads",
           "check_megatron_mlp", "check_row_parallel_linear", "check_tp_ring_bytes",
           "check_vocab_loss", "check_dp_average", "check_local_shape", "check_mesh_groups",
           "check_half_block", "check_merge_attention", "check_ring_forward",
           "check_tokens_to_heads", "check_zigzag_positions", "check_balancing_loss",
           "check_dispatch_tokens", "check_expert_grad_group", "check_keep_within_capacity",
           "check_permute_tokens", "check_z_loss", "check_accumulation_bytes",
           "check_activation_bytes", "check_mesh_groups_3d", "check_tp_bytes_per_step"]
