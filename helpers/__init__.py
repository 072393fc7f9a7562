"""The course's helpers: the one flat façade. What notebooks, scripts and the grader use is
importable as `helpers.X`; the rest stays in its home module, where tests import it from
(tests/test_layout.py).

Each name has one home module (the import lines below list them, one a module, in the order
of the table's rows; `helpers.X.__module__` says it too). Folders name the split, files the
version: simulated (one process, Part I/II), scratch (by hand across processes), torch_api
(torch's own), experiments (the chapters' runs).

home module                 what lives there                     helpers.X, e.g. (-: none)
torch_floor                 the oldest torch, checked on import  -
config, devices, data       run sizes, devices, Fashion-MNIST    choose, get_devices, load_tensors
models, tiny_models         LeNet, ResNet-18, Part V's models    lenet, resnet18, TinyLM, make_model
plotting, paths, validate   plots and glue, scripts, arguments   glue, script_path, validate_lr
script_args                 the DDP scripts' command line        script_parser, resolve_args
seeding                     the same weights from a seed         -
activations                 what autograd saves for backward     saved_tensor_bytes
costs, transformer_costs    cost formulas, a block's bytes       split_costs, block_params
compare, one_process        comparators, the unsplit runs        max_diff, all_close
                            everything is compared with
cost_explorer               the cost explorer's static twin      with_static_twin
profiling, prose, reference profiler, claims, GPU reference run  count_ops, claim, gpu_reference
words                       counts with their nouns in agreement plural, how_often
model_words                 the cost model's sentences           fit_words, load_words
reference_words, gpus_words the GPU reference's sentences        speed_words, pool_words
gpus_cost_words             a call's share of a step, in words   call_share_words
timing                      medians, spreads, ratios in turns    measure, interleave, ratio
runtime.group               THE init_process_group               setup, teardown, choose_backend
runtime.launch              THE way ranks start                  launch, run_ranks
runtime.errors              how a run of ranks fails             RankFailed
runtime.thread_world        ranks as threads (ThreadWorld)       -
runtime.comm                counted send/recv over ranks/threads DistComm
runtime.agree               ranks running the same collectives   -
runtime.traffic             bytes sent, on one log               ByteLog, send, count_traffic
runtime.intercept           THE rebinding of torch.distributed   -
runtime.files               THE atomic writer                    atomic_write, write_json
runtime.emulate             emulated durations (schedules)       Clock, Rates, clock_scale
runtime.checkpoint          checkpoints, snapshots               save_snapshot, load_checkpoint
runtime.mesh                ranks along named mesh dimensions    rank_grid, device_mesh
ring                        ring collectives, simulated devices  ring_all_gather, ...
data_parallel.*             Parts II-IV                          train, allreduce, DDPFromScratch
sharding.*                  Part V                               ShardedOptimizer, FSDPFromScratch
pipeline_parallel.*         Part I (simulated), Part VI          gpipe_order, pipeline_rank_step
tensor_parallel.*           Part I (simulated), Part VI          megatron_mlp, TPBlock, tp_plan
context_parallel.*          Part VII: the sequence split         ring_attention, ulysses_attention
expert_parallel.*           Part VII: mixture of experts         MoE, ExpertParallelMoE
composed.*                  Part VII: all at once, the planner   train_3d_scratch, plan
*schematics                 pictures drawn by the code they show plot_ring_allreduce, plot_shards
checks                      exercise checks (helpers.checks.X)   check_dp_average, ...
"""
# The course's mark: a notebook's set-up cell (scripts/colab_setup_cell.py) tells this package
# from any other module named `helpers` (a reader's helpers.py) by it.
__course__ = "multigpu-course"
# First: refuse a torch older than the course's floor, naming the fix (before any module
# touches an API it lacks).
from . import torch_floor  # its import checks the installed torch

from .config import choose, full, quick
from .devices import (Timer, exact_float32, get_devices, num_gpus, rank_clock, synced_now,
                      synchronize, try_all_gpus, try_gpu, gpu_chapter_figures, unsynced_timings)
from .data import (DataMissingError, load_data_fashion_mnist, load_tensors, ensure_data,
                   fashion_mnist)
from .models import (LENET_SHAPES, init_lenet_params, lenet, lenet_module, loss, num_params,
                     resnet18, unwrap)
from .tiny_models import (TinyLM, TinyBlock, counting_tokens, model_bytes, make_model, deep_mlp,
                          SmallAttention, small_block, small_stack, block_inputs, block_loss)
from .plotting import Animator, glue, progress
from .paths import script_path, script_diff
from .validate import (validate_positive_int, validate_lr, validate_seed, validate_output_path,
                       validate_step)
from .script_args import script_parser, resolve_args
from .activations import saved_tensor_bytes
from .costs import (layer_sizes, saved_per_layer, balanced_cuts, ring_bytes_per_device, split_costs,
                    plot_costs, OPTIMIZER_STATE_BYTES, SHARDING_STAGES, sharding_costs,
                    network_cuts, BACKWARD_SHARE)
from .transformer_costs import (activation_bytes_per_token, block_params, ring_attention_bytes,
                                moe_dispatch_bytes, ulysses_attention_bytes, moe_layer_seconds)
from .compare import all_close, max_diff
from .cost_explorer import with_static_twin
from .profiling import (quiet_native_stderr, quiet_profile, profile_cpu, collectives_in, count_ops,
                        trace_events, overlap_ms, exposed_ms, trace_sentence)
from .prose import claim, formatted, say
from .reference import (gpu_reference, describe_gpu_reference, gpu_figures, one_gpu_step,
                        failed_cells_words, failed_cells_note, add_gpu_path, gpu_runner_cli)
from .words import how_often, plural
from .model_words import (spread_verdict, largest_miss, comm_inside_step_words, fit_words,
                          load_words, sweep_memory_words, last_bucket_words)
from .reference_words import (speed_words, fixed_cost_words, memory_roof_words,
                              measured_step_words, call_vs_box_words)
from .gpus_words import (pool_words, copy_fit_words, unsynced_timing_words, size_growth_words,
                         memory_pass_words, compute_roof_words, gpu_roofs, reference_copies_words,
                         reference_link_words, reference_memory_words, reference_streams_words,
                         reference_chapter_figures, reference_timer_words,
                         H200_DATASHEET, LINK_SPECS, pinned_words, overlap_words,
                         threads_ratio_words, launch_bound_words, one_call_words, queued_words,
                         link_cost_words, fit_ends_words, iqr_words)
from .gpus_cost_words import call_share_words, call_share_summary, cache_copy_words
from .timing import (Measurement, Ratio, measure, interleave, ratio, machine_load, quartiles_word,
                     cpu_clock, MIN_ROUNDS)
from .runtime.group import (choose_backend, backend_for, env_ranks, rank_device, setup, teardown,
                            free_port, log0)
from .runtime.launch import launch, run_ranks
from .runtime.errors import RankFailed
from .runtime.comm import DistComm
from .runtime.traffic import ByteLog, send, count_traffic, FuncolBytes
from .runtime.files import atomic_write, write_json
from .runtime.emulate import Clock, Rates, clock_scale
from .runtime.checkpoint import (set_rng_state, save_snapshot, load_snapshot, save_checkpoint,
                                 save_snapshot_all, load_checkpoint)
from .runtime.mesh import rank_grid, coords_of, device_mesh
from .ring import ring_reduce_scatter, ring_all_gather
from .data_parallel.simulated import (get_params, allreduce, split_batch, sgd, train_batch, train,
                                      evaluate_accuracy, default_run_size)
from .data_parallel.dp_vs_ddp_experiments import time_dp_vs_ddp
from .data_parallel.allreduce import (flatten, unflatten_into, flat_allreduce,
                                      bucketed_allreduce, ring_allreduce, OverlapReducer,
                                      train_batch_overlap, allreduce_time, fit_alpha_beta,
                                      exposed_seconds, ASSUMED_LINKS, ASSUMED_BACKWARD_S)
from .data_parallel.fast import ResidentLoader, FastDataParallel, train_fast, replica_flat_grad
from .data_parallel.fast_experiments import train_fast_rank
from .data_parallel.fast_lenet import lenet_fused, fused_flat_grad, tap_major
from .data_parallel.compiled_step import train_compiled
from .data_parallel.scratch import DDPFromScratch, make_buckets
from .data_parallel.torch_api import (shard_indices, exact_counts, evaluate_exact,
                                      ddp_step_collectives, combine_stats, SyncBatchNormFunction,
                                      CPUSyncBatchNorm, convert_sync_batchnorm, TwoInputNet,
                                      side_features, bn_net, bn_stats, global_batches,
                                      train_bn_steps)
from .data_parallel.experiments import (bn_vs_syncbn, bn_grads_same_weights,
                                        uneven_inputs_join, ddp_trace, ddp_knobs)
from .data_parallel.words.verdicts import (against_prediction, graph_sentence, knob_words,
                                           bucket_words, message_cause, overlap_step_words,
                                           shared_rounding_words, arithmetic_share_words)
from .data_parallel.words.fixes_verdicts import (fused_step_words, compression_words,
                                                 bench_step_words, size_check)
from .data_parallel.words.fixes_words import (gpu_status_words, best_step_words,
                                              compiled_step_words, missed_words, arith_note_words,
                                              ablation_words, regime_counts, emulated_overlap_words,
                                              real_overlap_words, bench_accuracy_words,
                                              bench_scratch_words, device_words, trace_order_words,
                                              fusing_bound_words)
from .data_parallel.words.scaling_verdicts import (strong_words, two_workers_sentence,
                                                   sweep_words, sweep_summary)
from .data_parallel.words.scaling_words import (two_worker_words, weak_words, model_vs_run_words,
                                                setup_words, sweep_setup_note, below_range_words,
                                                step_ms_text, lenet_step_verdict, flat_upto_words)
from .data_parallel.words.scratch_verdicts import (takeoff_words, accuracy_gap_words,
                                                   epoch_speed_words)
from .data_parallel.words.seed_verdicts import (paired_verdict, chance_words, scaled_rate_verdict,
                                                equal_steps_verdict, chance_level_words)
from .data_parallel.syncbn_experiments import AloneSyncBatchNorm, syncbn_cost_times, syncbn_traffic
from .data_parallel.words.syncbn_words import (long_run_words, cost_words, found_words,
                                               comm_resolved_words, paired_accuracy_words)
from .data_parallel.words.ddp_words import (dp_ddp_words, timeline_clock_words, exposed_words,
                                            pending_words, flight_recorder_words,
                                            reference_dump_words, nodes_same_words,
                                            join_share_words, walk_growth_words, flag_cost_words,
                                            flag_step_words)
from .data_parallel.scratch_experiments import (ddp_vs_one_process, Branchy, unused_vs_torch,
                                                accumulation_vs_torch, scratch_refusals,
                                                exposed_comm_times)
from .data_parallel.overlap_experiments import (gradient_timeline, overlap_step_times,
                                                ddp_scratch_trace, emulated_overlap)
from .data_parallel.speed_experiments import (time_data_parallel, lenet_module_from, bench_ranks,
                                  time_gloo_allreduce)
from .data_parallel.words.profile_verdicts import (simulated_devices_words, same_code_words,
                                                   loader_step_words, compute_split_words,
                                                   allreduce_split_words, overlap_lengthens_words,
                                                   alone_prediction_words, split_prediction_words,
                                                   backward_compute_words, emulation_margin_words,
                                                   thesis_words)
from .data_parallel.words.trace_verdicts import (bucket_launch_words, trace_region_words,
                                                 reducer_wait_words, trace_actor_words,
                                                 trace_cut_words, OUTSIDE_MS, WAIT_IDLE_MS)
from .data_parallel.words.profile_words import (profile_gpu_status, self_check_words, split_lead_in,
                                                halves_control_words, fixed_part_words,
                                                gpu_arithmetic_words)
from .sharding.zero import partition_by_size, ShardedOptimizer, Zero2
from .sharding.flat import (flat_shard, all_gather_flat, padded_flat, reduce_scatter_flat,
                            clip_sharded_grad_norm_)
from .sharding.fsdp_scratch import FSDPFromScratch, GatherParams, FSDPUnit
from .sharding.torch_api import fsdp2_api, fsdp2_model, fsdp2_layers
from .sharding.fsdp2_words import checkpoint_time_words
from .sharding.experiments import (zero1_vs_one_process, zero2_vs_one_process,
                                   fsdp_scratch_vs_one_process, fsdp2_vs_one_process,
                                   dcp_save_sharded, dcp_load_resharded, memory_per_stage,
                                   zero1_checkpoint, full_optimizer_state, held_bytes)
from .sharding.knobs_experiments import (zero2_accumulation, clip_over_shards, fsdp_knobs,
                             mixed_precision_zero, refusals)
from .sharding.mixed import MixedPrecisionZero
from .sharding.memory import PeakBytes
from .sharding.variants import (activation_partition_costs, fused_buffer_bytes, offload_costs,
                                quantize_blocks, dequantize_blocks, quantized_all_gather,
                                zeropp_costs, variant_memory, variant_traffic, plot_variants)
from .sharding.variants_experiments import offload_run, qwz_vs_all_gather
from .pipeline_parallel.schedules import (gpipe_order, one_f_one_b_order, validate_orders,
                                          clock_ticks, bubble_fraction, schedule_bubble, replay,
                                          measured_bubble, peak_live, plot_schedule, plot_live,
                                          one_f_one_b_rank_order, busy_times, timeline_bubble,
                                          as_schedule, unequal_bubble, interleaved_order,
                                          interleaved_ticks, interleaved_bubble, stage_times,
                                          with_durations)
from .pipeline_parallel.simulated import (split_sequential, run_schedule, pipeline_1f1b,
                                          multiply_adds, run_interleaved, pipeline_order_words)
from .pipeline_parallel.split_words import (mac_bubble_words, simulated_timing_words,
                                            bubble_vs_formula_words, devices_words,
                                            stage_layers_words, naive_order_words)
from .pipeline_parallel.scratch import (pipeline_net, stage_of, pipeline_rank_step, unsplit_step,
                                        layer_times, LinearTape, LiveActivations)
from .pipeline_parallel.timelines import (pipeline_model_time, replayed_bubble, wait_parts,
                                          zero_bubble_rank_order, zero_bubble_bubble, bubble_added)
from .pipeline_parallel.torch_api import (validate_pipelining, make_schedule, pipelining_step,
                                          pipelining_runs, LOOPED_SCHEDULES)
from .pipeline_parallel.experiments import (pipeline_run, pipelining_run, pingpong_run,
                                             forward_flops, box_model)
from .pipeline_parallel.verdicts import (bubble_trend_words, schedule_gap,
                                         message_delay_words, balance_words)
from .tensor_parallel.split_words import bytes_vs_dp_words, paired_vs_column_words
from .tensor_parallel.simulated import (copy_to_shards, reduce_from_shards, megatron_mlp,
                                        dense_split_rows, lenet_gathered_shards)
from .tensor_parallel.scratch import TPMLP, TPAttention, TPBlock, split_dims, gather_shards
from .tensor_parallel.torch_api import tp_plan, sp_plan
from .tensor_parallel.sequence import (GatherSequence, SPBlock, sync_replicated_grads,
                                       VocabEmbedding,
                                       vocab_parallel_cross_entropy, tiny_tp_lm)
from .tensor_parallel.experiments import tp_worker, mesh2d_worker, hsdp_worker
from .context_parallel.scratch import (split_positions, shard_sequence, unshard_sequence,
                                       attention_reference, block_attention, merge_blocks,
                                       ring_attention, RingAttention, block_work, causal_block,
                                       ring_pass, RingCensus)
from .context_parallel.torch_api import context_parallel_status, torch_context_parallel
from .context_parallel.experiments import (qkv_inputs, cp_attention_run,
                                           cp_ulysses_run, cp_activation_memory, cp_torch_run)
from .context_parallel.ulysses import seq_to_heads, heads_to_seq, SeqToHeads, ulysses_attention
from .expert_parallel.moe import route, load_balancing_loss, MoE, moe_inputs, router_z_loss
from .expert_parallel.scratch import AllToAll, ExpertParallelMoE
from .expert_parallel.experiments import ep_equal_run, ep_imbalance_run, ep_production_run
from .expert_parallel.torch_api import EPMoE, ep_dp_mesh, permute_by_expert
from .composed.scratch import one_process_run, cp_gpt
from .composed.experiments import train_3d_scratch, train_3d_torch, train_cp_zero2
from .composed.planner_page import PLANNER_FIELDS, plan_table_html, with_planner_twin
from .composed.planner import stage_costs, plan, data_parallel_costs
from .tensor_parallel.schematics import (ring_steps, plot_ring_allreduce, megatron_trace,
                                         plot_megatron_mlp)
from .pipeline_parallel.schematics import plot_network_split, plot_pipeline_schedules
from .sharding.schematics import plot_shards, plot_memory_per_stage
from .data_parallel.schematics.bucket_schematics import (bucket_timeline, plot_buckets,
                                                         plot_data_parallel_steps)
from .data_parallel.schematics.wrapper_schematics import ddp_wrapper_facts, plot_ddp_wrapper
from .data_parallel.schematics.dp_schematics import (dp_step_facts, plot_dp_step,
                                                     scratch_step_facts, plot_scratch_step)
from .data_parallel.schematics.torchrun_schematics import (sampler_facts, plot_sampler,
                                                           restart_facts, plot_restart,
                                                           torchrun_facts, plot_torchrun)
from .data_parallel.schematics.syncbn_schematics import syncbn_facts, plot_syncbn
from .data_parallel.schematics.profile_schematics import plot_phases
from .data_parallel.schematics.scaling_schematics import (plot_scaling, plot_alpha_beta_fit,
                                                          plot_exposed)
from .context_parallel.schematics import ring_schedule, plot_ring, plot_split
from .expert_parallel.schematics import dispatch_counts, plot_all_to_all
from .composed.schematics import draw_mesh
from .stream_schematics import (queue_timeline, plot_queue_timeline, machine_links,
                                plot_gpu_machine,
                                two_stream_facts, plot_two_streams)
