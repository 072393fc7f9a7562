"""Part VI's checks, one module per chapter group: part6_pipeline (pipeline_dist) and
part6_tensor (tensor_parallel_dist, mesh2d). (This module keeps the old import path,
`helpers.checks.splits_dist`, working.)"""
from . import part6_pipeline, part6_tensor
from .part6_pipeline import *   # noqa: F401,F403
from .part6_tensor import *     # noqa: F401,F403

__all__ = [*part6_pipeline.__all__, *part6_tensor.__all__]
