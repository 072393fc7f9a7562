"""The course's helpers: small modules, one job each. Everything is importable from the top level.

devices   which devices to use (real or simulated GPUs), honest timing
data      Fashion-MNIST through torchvision
models    LeNet (functional and as a module), ResNet-18
parallel  data parallelism from scratch: get_params, allreduce, split_batch
training  sgd, train_batch, train, evaluate_accuracy
plotting  live training plot, progress bar, glue
splits    Part I: splitting a model across layers and within a layer (costs: what each split costs)
tensor_parallel  Part I: ring all-reduce over simulated devices, Megatron's f/g and its MLP
distributed  Part III: DistributedDataParallel set-up, samplers, checkpoints
          (ddp_worker: spawned workers)
fast      Part IV: the fast data-parallel trainer (comm: allreduce variants and their cost model)
paths     script_path: the course's scripts (scripts/ddp) in a checkout or an installed copy
checkpoint  files written atomically (checkpoints, metrics), snapshots to resume from bitwise
validate  inputs checked at every entry point, before any work (one global-batch rule)
ddp_scratch  Part III: DDPFromScratch, data parallelism across processes built by hand
zero      Part V: ZeRO-1 (ShardedOptimizer) and ZeRO-2 (Zero2);
          fsdp_scratch: ZeRO-3, FSDPFromScratch
tiny_models  Part V: a deep MLP and a tiny decoder-only transformer; traffic: bytes sent, counted
shard_workers  Parts III and V: multi-process experiments started from notebooks (run_ranks)
ranks     Part VI: send/recv/all-reduce over torch.distributed or threads, counted; spawn_ranks
pipeline_dist  Part VI: a pipeline across processes (GPipe, 1F1B), torch's pipelining
tp_dist   Part VI: tensor parallel across processes (Megatron f/g, heads), DTensor, a 2D mesh
workers   Part IV: real data-parallel worker processes on a CPU (gloo, one thread each, pinned)
profiling Part IV: the profiler without native log noise, counting a step's calls
gpu_reference  Part IV: the committed GPU reference run, shown beside the reader's figures
prose     claims the prose makes about a run, asserted (claim)
checks    exercise checks (imported as helpers.checks)
"""
from .config import choose, quick
from .data import (DataMissingError, data_dir, fashion_mnist, load_data_fashion_mnist,
                   load_tensors)
from .devices import (Timer, exact_float32, get_devices, num_gpus, require_gpus, synchronize,
                      try_all_gpus, try_gpu)
from .models import (init_lenet_params, lenet, lenet_module, loss, num_params, resnet18)
from .parallel import allreduce, get_params, split_batch
from .plotting import Animator, glue, progress
from .training import default_run_size, evaluate_accuracy, sgd, train, train_batch
from .splits import *        # noqa: F401,F403
from .tensor_parallel import *  # noqa: F401,F403
from .costs import *         # noqa: F401,F403
from .cost_explorer import cost_explorer_html, cost_grid, with_static_twin
from .checkpoint import *    # noqa: F401,F403
from .validate import *      # noqa: F401,F403
from .distributed import *   # noqa: F401,F403
from .ddp_worker import *    # noqa: F401,F403
from .fast import *          # noqa: F401,F403
from .comm import *          # noqa: F401,F403
from .paths import *         # noqa: F401,F403
from .ddp_scratch import *   # noqa: F401,F403
from .tiny_models import *   # noqa: F401,F403
from .zero import *          # noqa: F401,F403
from .fsdp_scratch import *  # noqa: F401,F403
from .traffic import *       # noqa: F401,F403
from .shard_workers import *  # noqa: F401,F403
from .ranks import *         # noqa: F401,F403
from .pipeline_dist import * # noqa: F401,F403
from .tp_dist import *       # noqa: F401,F403
from .workers import *       # noqa: F401,F403
from .gpu_reference import *  # noqa: F401,F403
from .profiling import *     # noqa: F401,F403
from .prose import *         # noqa: F401,F403
