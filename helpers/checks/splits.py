"""Part I's checks, one module per chapter: network_split, within_layer, data_parallel, costs.
(This module keeps the old import path, `helpers.checks.splits`, working.)"""
from . import costs, data_parallel, network_split, within_layer
from .costs import *            # noqa: F401,F403
from .data_parallel import *    # noqa: F401,F403
from .network_split import *    # noqa: F401,F403
from .within_layer import *     # noqa: F401,F403
from .within_layer import check_mlp_column_then_row  # noqa: F401  not an exercise: tests use it

__all__ = [*costs.__all__, *data_parallel.__all__, *network_split.__all__, *within_layer.__all__]
