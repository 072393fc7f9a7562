"""Fashion-MNIST's decoded tensors, cached per data folder: torchvision decodes a split once.

Importing torchvision costs every fresh process ~1.4 s of CPU (each rank of every job); the
decoded split, saved as `FashionMNIST/tensors/{train,test}.pt`, loads in a few ms without it.
The file holds the uint8 images, the int64 labels, their crc32 and the stat keys (size, times,
inode) of the md5-verified raw files it was decoded from: any difference, a damaged file or one
of another shape makes it a miss, and the caller decodes again and rewrites it (atomically).
"""
import zlib

import torch

from .runtime.files import atomic_write

__all__ = ["cache_path", "read", "write"]

FORMAT = 1
SPLITS = {True: ("train", 60000), False: ("test", 10000)}   # train=True/False: name, images
SIDE = 28


def cache_path(root, train):
    """Where the decoded split `train` (True/False) of the data folder `root` is kept."""
    return root / "FashionMNIST" / "tensors" / f"{SPLITS[train][0]}.pt"


def _crc(images, targets):
    crc = zlib.crc32(memoryview(images.numpy()).cast("B"))
    return zlib.crc32(memoryview(targets.numpy()).cast("B"), crc)


def read(root, train, keys):
    """(images, targets) from the cache if it was decoded from the raw files whose stat keys are
    `keys` ({name: key}) and is whole; else None (missing, stale, unreadable or damaged)."""
    try:
        saved = torch.load(cache_path(root, train), weights_only=True)
    except Exception:   # missing, truncated, not a zip, unpicklable: a miss, decoded again
        return None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("keys") != keys:
        return None
    images, targets, n = saved.get("images"), saved.get("targets"), SPLITS[train][1]
    if not (isinstance(images, torch.Tensor) and isinstance(targets, torch.Tensor)
            and images.dtype == torch.uint8 and images.shape == (n, SIDE, SIDE)
            and targets.dtype == torch.int64 and targets.shape == (n,)
            and images.is_contiguous() and targets.is_contiguous()):
        return None
    if saved.get("crc32") != _crc(images, targets):   # a changed byte (30 ms for the train split)
        return None
    return images, targets


def write(root, train, images, targets, keys):
    """Save the decoded split for the next process; a folder that cannot take it (read-only,
    full) is left as it is: the load goes on, and the next process decodes again."""
    path = cache_path(root, train)
    images, targets = images.contiguous(), targets.contiguous()
    saved = dict(format=FORMAT, keys=keys, images=images, targets=targets,
                 crc32=_crc(images, targets))
    try:
        path.parent.mkdir(exist_ok=True)
        # no fsync: a file a power cut leaves damaged fails the checks above and is rebuilt
        atomic_write(path, lambda f: torch.save(saved, f), durable=False)
    except OSError:
        pass
