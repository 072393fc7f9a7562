"""Exercise checks, one module per part. `from helpers.checks import check_...` in a notebook."""
from ._core import *            # noqa: F401,F403  the framework: run_check, expect, Result
from .gpus import *             # noqa: F401,F403  foundation chapter
from .splits import *           # noqa: F401,F403  Part I (network_split, within_layer, ...)
from .scratch import *          # noqa: F401,F403  Part II
from .dataparallel import *      # noqa: F401,F403  Part III: DataParallel
from .custom_modules import *   # noqa: F401,F403  Part III: custom modules
from .ddp_torchrun import *              # noqa: F401,F403  Part III: DDP with torchrun
from .ddp_scratch import *      # noqa: F401,F403  Part III: DDP from scratch
from .syncbn import *           # noqa: F401,F403  Part III: BatchNorm across devices
from .profile import *             # noqa: F401,F403  Part IV: profile
from .fixes import *            # noqa: F401,F403  Part IV: fixes
from .scaling import *          # noqa: F401,F403  Part IV: scaling
from .zero import *             # noqa: F401,F403  Part V: ZeRO
from .fsdp_scratch import *     # noqa: F401,F403  Part V: FSDP from scratch
from .fsdp2 import *            # noqa: F401,F403  Part V: FSDP2, recomputation
from .splits_dist import *      # noqa: F401,F403  Part VI
from .context_parallel import * # noqa: F401,F403  Part VII: context parallelism
from .expert_parallel import *  # noqa: F401,F403  Part VII: expert parallelism
from .composed import *         # noqa: F401,F403  Part VII: everything at once
