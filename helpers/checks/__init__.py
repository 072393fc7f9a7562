"""Exercise checks, one module per part. `from helpers.checks import check_...` in a notebook."""
from ._core import *            # noqa: F401,F403  the framework: run_check, expect, Result
from .gpus import *             # noqa: F401,F403  foundation chapter
from .splits import *           # noqa: F401,F403  Part I (network_split, within_layer, ...)
from .scratch import *          # noqa: F401,F403  Part II
from .concise import *          # noqa: F401,F403  Part III
from .ddp import *              # noqa: F401,F403  Part III: DDP with torchrun
from .fast import *             # noqa: F401,F403  Part IV
from .sharding import *         # noqa: F401,F403  Part III (DDP from scratch) and Part V
from .splits_dist import *      # noqa: F401,F403  Part VI
from .part7 import *           # noqa: F401,F403  Part VII
