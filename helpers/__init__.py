"""The course's helpers: small modules, one job each. Everything is importable from the top level.

devices   which devices to use (real or simulated GPUs), honest timing
data      Fashion-MNIST through torchvision
models    LeNet (functional and as a module), ResNet-18
parallel  data parallelism from scratch: get_params, allreduce, split_batch
training  sgd, train_batch, train, evaluate_accuracy
plotting  live training plot, progress bar, glue
splits    Part I: splitting a model across layers and within a layer (costs: what each split costs)
distributed  Part III: DistributedDataParallel set-up, samplers, checkpoints (ddp_worker: spawned workers)
fast      Part IV: the fast data-parallel trainer (comm: allreduce variants and their cost model)
workers   Part IV: real data-parallel worker processes on a CPU (gloo, one thread each, pinned)
profiling Part IV: the profiler without native log noise, counting a step's calls
gpu_reference  Part IV: the committed GPU reference run, shown beside the reader's figures
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
from .costs import *         # noqa: F401,F403
from .distributed import *   # noqa: F401,F403
from .ddp_worker import *    # noqa: F401,F403
from .fast import *          # noqa: F401,F403
from .comm import *          # noqa: F401,F403
from .workers import *       # noqa: F401,F403
from .gpu_reference import *  # noqa: F401,F403
from .profiling import *     # noqa: F401,F403
