"""Part VII, everything at once: the chapter's runs, `fn(rank, world, cfg) -> result`."""
from .scratch import train_3d_scratch
from .torch_api import train_3d_torch

__all__ = ["train_3d_both"]


def train_3d_both(rank, world, cfg):
    """The course's 3-D run and torch's on the same mesh, batches and seeds, in one launch
    (starting eight processes is the slow part on a CPU): {"scratch": ..., "torch": ...}."""
    out = dict(scratch=train_3d_scratch(rank, world, cfg))
    if cfg.get("torch", True):
        out["torch"] = train_3d_torch(rank, world, cfg)
    return out
