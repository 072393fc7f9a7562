"""Inputs checked at the entry of every trainer and script, before any work is done.

Each check raises a clear error that names the fix (TypeError for a wrong kind of value,
ValueError for a wrong value). The rule for a global batch that does not split evenly over the
ranks lives here, once, for single.py, spawn.py and torchrun.py: refuse, and name the nearest
batch sizes that do split. The rule for a count (validate_positive_int) is whole_numbers', which
devices (below this module) uses too; every other module takes it from here.
"""
import collections.abc
import math
import numbers
import os
import shlex
from pathlib import Path

import torch

from .devices import num_gpus
from .whole_numbers import validate_positive_int  # the count rule (devices uses it too)
from .words import plural

__all__ = ["validate_positive_int", "validate_lr", "validate_seed", "validate_global_batch",
           "validate_backend", "validate_output_path", "validate_step", "SnapshotError",
           "validate_snapshot"]

BACKENDS = ("gloo", "nccl")


def validate_lr(lr):
    """The learning rate must be a finite number > 0 (a float or an int, not a string)."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        hint = f": pass lr={lr} without quotes" if isinstance(lr, str) else ": e.g. lr=0.1"
        raise TypeError(f"lr must be a number, got {lr!r} ({type(lr).__name__}){hint}")
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number above 0, got {lr}: e.g. lr=0.1")
    return float(lr)


def validate_seed(seed, name="seed"):
    """None (a different run each time) or an int (the same run each time) that torch's
    generators take (64 bits)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"{name} must be an int or None, got {seed!r} ({type(seed).__name__})")
    if seed is not None and not -2**63 <= seed < 2**63:
        raise ValueError(f"{name} {seed} does not fit in 64 bits: use e.g. {name} 0")
    return seed


def _validate_images(X, y=None):
    """X must be float images of shape (n, 1, 28, 28) (what LeNet takes); y integer labels of
    length n."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}: torch.as_tensor(X)")
    if not X.is_floating_point():
        raise TypeError(f"X has dtype {X.dtype}; LeNet needs floats: X.float() / 255 "
                        "(pixels in [0, 1])")
    if X.dim() == 3 and X.shape[1:] == (28, 28):
        raise ValueError(f"X has shape {tuple(X.shape)}, LeNet needs (n, 1, 28, 28): add the "
                         "channel dimension: X.unsqueeze(1)")
    if X.dim() != 4 or X.shape[1:] != (1, 28, 28):
        raise ValueError(f"X has shape {tuple(X.shape)}, LeNet needs (n, 1, 28, 28) "
                         "(one 28x28 grey-scale channel per image)")
    if y is not None:
        if not isinstance(y, torch.Tensor) or y.is_floating_point() or y.dim() != 1:
            what = f"dtype {y.dtype}, shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) \
                else type(y).__name__
            raise TypeError(f"y must be a 1-D tensor of integer class labels, got {what}: "
                            "y.long().view(-1)")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}; they must "
                             "pair up")
        if y.numel() and not 0 <= int(y.min()) <= int(y.max()) < 10:
            raise ValueError(f"y holds labels from {int(y.min())} to {int(y.max())}; LeNet has "
                             "10 classes, so labels must be 0..9 (Fashion-MNIST's classes)")
    return X


def validate_global_batch(batch_size, world_size, flag="--batch-size", note=""):
    """THE rule for all three scripts: the global batch must split evenly over the ranks (every
    rank takes batch_size // world_size examples a step). Otherwise refuse, naming the fix.
    `note` says where an untyped value came from (" (the --dry-run default)")."""
    validate_positive_int(batch_size, flag)
    validate_positive_int(world_size, "world_size")
    if batch_size % world_size:
        lo = batch_size // world_size * world_size
        near = " or ".join(str(b) for b in (lo, lo + world_size) if b > 0)
        raise ValueError(f"{flag} {batch_size}{note} does not split evenly over {world_size} "
                         f"ranks: use a multiple of {world_size} ({near}), e.g. {flag} "
                         f"{lo + world_size}, or another number of ranks")
    return batch_size // world_size


def validate_backend(backend, local_world_size=1):
    """None (let helpers.choose_backend pick), "gloo", or "nccl" where every rank on this
    machine has a GPU of its own."""
    if backend is None:
        return None
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}: "
                         "use gloo (CPUs) or nccl (one GPU per rank), or omit it")
    if backend == "nccl":
        n = num_gpus()
        if not torch.distributed.is_nccl_available() or n < local_world_size:
            raise ValueError(f"backend nccl needs one GPU per rank: "
                             f"{plural(local_world_size, 'rank')} here, {plural(n, 'GPU')}: "
                             "use --backend gloo, or omit --backend "
                             "(the default picks what works)")
    return backend


def validate_output_path(path, flag):
    """A file we will write at the END of a run must be writable at its START."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        name = {"--metrics": "metrics.json", "--snapshot": "snapshot.pt",
                "--json": "bench.json"}.get(flag, "model.pt")
        raise ValueError(f"{flag} {path} is a folder: give a file name, e.g. {path / name}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: the folder {folder} does not exist: create it first "
                         f"(mkdir -p {folder}) or fix the path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder {folder} is not writable: choose a "
                         "folder you can write to")
    return path


def validate_step(X, y, device_params, devices, lr):
    """What train_batch needs, checked before any replica computes or steps: a replica per
    device, images of the right shape, a numeric learning rate."""
    if not isinstance(devices, collections.abc.Sequence):
        raise TypeError(f"devices must be a list, got a {type(devices).__name__} (it can be read "
                        "only once, and every step reads it): pass list(devices)")
    if not devices:
        raise ValueError("no devices given: pass at least one, e.g. helpers.get_devices(1)")
    if len(device_params) != len(devices):
        raise ValueError(f"{len(device_params)} replicas for {len(devices)} devices: make one "
                         "replica per device, [get_params(params, d) for d in devices]")
    _validate_images(X, y)
    if X.shape[0] == 0:
        raise ValueError("an empty batch: give at least one example")
    dtype = device_params[0][0].dtype if device_params and len(device_params[0]) else X.dtype
    if X.dtype != dtype:
        raise TypeError(f"X is {X.dtype} but the parameters are {dtype}: convert one to the "
                        f"other, e.g. X.to({dtype})")
    validate_lr(lr)


# --- snapshots (runtime.checkpoint writes them; read here, so the scripts can check theirs) ---

class SnapshotError(ValueError):
    """A --snapshot file that cannot be resumed from: damaged, another kind of file, or saved by
    another number of ranks."""


SNAPSHOT_KEYS = ("model", "optimizer", "epoch", "rng", "history")


def validate_snapshot(path, world_size=None):
    """The snapshot at `path` (what helpers.save_snapshot writes), loaded safely (weights_only:
    tensors and plain values, no code) and checked. Otherwise a SnapshotError that names the
    file, what is wrong with it and what to do. `world_size`: the ranks about to resume."""
    fix = (f"delete it to start afresh (rm {shlex.quote(str(path))}), or give --snapshot "
           "another file")
    if os.path.getsize(path) == 0:
        raise SnapshotError(f"the snapshot {path} is empty (0 bytes): {fix}")
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # truncated, random bytes, JSON, pickled code: torch's many errors
        raise SnapshotError(f"the snapshot {path} cannot be read ({_load_error(e)}): it is "
                            f"damaged (truncated?) or not a snapshot: {fix}") from e
    if isinstance(snap, dict) and snap and all(isinstance(v, torch.Tensor)
                                               for v in snap.values()):
        raise SnapshotError(f"{path} is a model's state_dict (what --save writes), not a snapshot "
                            "(model, optimizer, epoch, random states): give --save and "
                            f"--snapshot different files; {fix}")
    missing = [k for k in SNAPSHOT_KEYS if not isinstance(snap, dict) or k not in snap]
    if missing or not (isinstance(snap["epoch"], int) and snap["epoch"] >= 0
                       and isinstance(snap["rng"], list) and snap["rng"]
                       and isinstance(snap["optimizer"], dict)
                       and snap["optimizer"].get("param_groups")):
        what = f"it lacks {', '.join(missing)}" if missing else "its epoch, rng or optimizer " \
            "entry is not what helpers.save_snapshot writes"
        raise SnapshotError(f"{path} is not a snapshot ({what}): {fix}")
    saved = len(snap["rng"])
    if world_size is not None and saved != world_size:
        raise SnapshotError(f"{path} was saved by {plural(saved, 'rank')} and this run has "
                            f"{world_size}: resume with {plural(saved, 'rank')} (each rank's "
                            f"data order and random "
                            f"states are in it), or {fix}")
    return snap


def _load_error(e):
    """torch.load's error in one short line (its weights_only refusals run to a paragraph)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        why = [ln for ln in lines[1:] if not ln.startswith(("Please file", "Check the doc"))]
        return "weights_only=True refused it" + (f": {why[0][:120]}" if why else "")
    first = lines[0].split(". ")[0][:120] if lines else ""
    return type(e).__name__ + (f": {first}" if first else "")
