"""Checkpoints and snapshots a run can resume from bitwise, written atomically (runtime.files:
a kill at any moment leaves either the old file or the new one, never half of one).

A snapshot holds what a continuation needs to be exactly the run that was never stopped: the
model, the optimizer state, the next epoch (the sampler's epoch: `set_epoch` makes the data order
a function of it) and the random number generators (torch CPU, this rank's GPU where it uses
one, Python's `random`, NumPy's) of every rank.
"""
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from ..models import unwrap
from ..validate import validate_snapshot
from .files import atomic_save
from .group import get_rank, get_world_size

__all__ = ["rng_state", "set_rng_state", "save_snapshot", "load_snapshot", "save_checkpoint",
           "save_snapshot_all", "load_checkpoint"]

RngState = dict[str, Any]   # rng_state()'s: a generator's name -> its state, as plain values


def rng_state() -> RngState:
    """The states of every random number generator a training step may draw from, as plain
    Python values (lists of ints), so they pickle anywhere (all_gather_object, weights_only):
    the CPU's, and the GPU's this process computes on (the current CUDA device, where CUDA is
    in use: a rank never reads, and so never wakes, the other ranks' GPUs)."""
    state = {"torch": torch.get_rng_state().tolist(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        state["cuda"] = {"device": device, "state": torch.cuda.get_rng_state(device).tolist()}
    try:
        import numpy as np
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.tolist(), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    return state


def set_rng_state(state: RngState) -> None:
    """Restore what `rng_state()` returned (the GPU's state into the current CUDA device; a
    snapshot of the older format, one state per visible GPU, gives it its own)."""
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        device = torch.cuda.current_device()
        saved = cuda["state"] if isinstance(cuda, dict) else cuda[min(device, len(cuda) - 1)]
        torch.cuda.set_rng_state(torch.tensor(saved, dtype=torch.uint8), device)
    if "numpy" in state:
        import numpy as np
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_snapshot(path: str | os.PathLike, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, epoch: int, history: Iterable[Any] = (),
                  rng: list[RngState] | None = None) -> Path:
    """Atomically save what a resumed run needs. `epoch` is the NEXT epoch to run. `rng` is a list
    of per-rank `rng_state()`s (gathered by the caller under DDP); this process's by default."""
    snap = {"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
            "epoch": int(epoch), "rng": rng if rng is not None else [rng_state()],
            "history": list(history)}
    return atomic_save(snap, path)


def load_snapshot(path: str | os.PathLike, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, rank: int = 0, lr: float | None = None
                  ) -> tuple[int, list[Any]]:
    """Restore a snapshot into `model` and `optimizer` and this rank's RNGs; returns
    (next epoch, history). Loads with weights_only=True: tensors and plain values only. A damaged
    or foreign file, or one saved by another number of ranks, is refused (SnapshotError, naming
    the file and what to do) before anything is restored. `lr`: where given, every parameter
    group goes on with it instead of the saved learning rate."""
    world = max(get_world_size(), rank + 1)   # (a rank given without a process group: at least)
    snap = validate_snapshot(path, world_size=world)
    state = snap["model"]
    consume_prefix_in_state_dict_if_present(state, "module.")
    unwrap(model).load_state_dict(state)
    optimizer.load_state_dict(snap["optimizer"])
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    set_rng_state(snap["rng"][rank])
    return snap["epoch"], snap["history"]


# ---- under DDP: one writer, every rank's RNG states ---------------------------------------
def save_checkpoint(model: torch.nn.Module, path: str | os.PathLike) -> bool:
    """Rank 0 saves the UNWRAPPED state_dict (keys without "module."); returns True where saved.
    Other ranks that then read the file must wait for it (dist.barrier())."""
    if get_rank() != 0:
        return False
    atomic_save(unwrap(model).state_dict(), path)   # a kill mid-save keeps the old file whole
    return True


def save_snapshot_all(path: str | os.PathLike, model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer, epoch: int,
                      history: Iterable[Any] = ()) -> None:
    """Every rank calls it (it gathers each rank's RNG states: a collective); rank 0 writes the
    snapshot atomically. `epoch` is the next epoch to run."""
    if hasattr(optimizer, "consolidate_state_dict"):   # ZeRO: each rank holds a share
        optimizer.consolidate_state_dict(to=0)          # (ZeroRedundancyOptimizer, ours)
    rngs = [rng_state()]
    if get_world_size() > 1:
        rngs = [None] * get_world_size()
        dist.all_gather_object(rngs, rng_state())
    if get_rank() == 0:
        save_snapshot(path, model, optimizer, epoch, history, rng=rngs)


def load_checkpoint(model: torch.nn.Module, path: str | os.PathLike,
                    map_location: str | torch.device = "cpu") -> Any:
    """Load a state_dict saved with or without the wrapper's "module." prefix, safely
    (weights_only=True: tensors and plain values only, no arbitrary pickled code); returns
    load_state_dict's missing and unexpected keys."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    consume_prefix_in_state_dict_if_present(state, "module.")
    return unwrap(model).load_state_dict(state)
