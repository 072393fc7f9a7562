"""Part VI's checks, one module per chapter group: pipeline_dist (pipeline_dist) and
tensor_parallel_dist (tensor_parallel_dist, mesh2d). (This module keeps the old import path,
`helpers.checks.splits_dist`, working.)"""
from . import mesh2d, pipeline_dist, tensor_parallel_dist
from .pipeline_dist import *   # noqa: F401,F403
from .tensor_parallel_dist import *     # noqa: F401,F403
from .mesh2d import *     # noqa: F401,F403

__all__ = [*pipeline_dist.__all__, *tensor_parallel_dist.__all__, *mesh2d.__all__]
