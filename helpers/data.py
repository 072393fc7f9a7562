"""Fashion-MNIST through torchvision, into a writable data folder (COURSE_DATA overrides it)."""
import os
import socket
from pathlib import Path

import torch
from torch.utils import data

from .validate import check_positive_int

__all__ = ["DataMissingError", "data_dir", "fashion_mnist", "load_data_fashion_mnist",
           "load_tensors"]

DATA_ENV = "COURSE_DATA"
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# Byte sizes of the four extracted (gunzipped) files, computed once from torchvision's verified
# archives: len(gzip.open(f).read()) for each .gz (a 16-byte header + 28*28 bytes per image; an
# 8-byte header + 1 byte per label). A file of another size is truncated or is not the original.
EXTRACTED_SIZES = {"train-images-idx3-ubyte": 47040016, "train-labels-idx1-ubyte": 60008,
                   "t10k-images-idx3-ubyte": 7840016, "t10k-labels-idx1-ubyte": 10008}
MAGIC = {"images": 2051, "labels": 2049}   # the idx format's first 4 bytes (big-endian)
LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat",
          "sandal", "shirt", "sneaker", "bag", "ankle boot")


class DataMissingError(RuntimeError):
    """Fashion-MNIST is not on disk and could not be downloaded."""


def data_dir():
    """The data folder: $COURSE_DATA, else `data/` at the repository root (git-ignored), or
    ~/.cache/multigpu-course/data when helpers is installed from a package (e.g. in Colab)."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").exists():
        return repo / "data"
    return Path.home() / ".cache" / "multigpu-course" / "data"


def fashion_mnist(train=True, transform=None, root=None):
    """The torchvision dataset, downloaded on first use (a seeded raw/ folder skips the network)."""
    import torchvision   # imported here: worker processes that never load data start faster
    from torchvision import transforms
    root = Path(root) if root is not None else data_dir()
    raw = root / "FashionMNIST" / "raw"
    _check_extracted(raw)   # bad extracted files go; torchvision re-extracts the archives
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)   # torchvision's urllib calls have none: never hang offline
    try:
        return torchvision.datasets.FashionMNIST(
            root=str(root), train=train, download=True,
            transform=transform or transforms.ToTensor())
    except Exception as e:  # URLError, timeouts, md5 mismatch: all mean "the data is not here"
        if isinstance(e, PermissionError) or not _writable(raw):
            raise DataMissingError(
                f"cannot write into {raw} ({type(e).__name__}: {e}): the folder is read-only, "
                "so the archives cannot be downloaded or extracted there. Make it writable, or "
                f"copy it to a writable folder and set {DATA_ENV} to that folder.") from e
        _remove_partial(raw)
        raise DataMissingError(
            f"Fashion-MNIST is not in {raw} and downloading it failed ({type(e).__name__}: {e}). "
            f"Put the four original files {', '.join(FILES)} in that folder (torchvision checks "
            f"their md5s), or set {DATA_ENV} to a folder whose FashionMNIST/raw/ holds "
            "them.") from e
    finally:
        socket.setdefaulttimeout(old_timeout)


def _writable(folder):
    """True if files can be created in `folder` (or in the nearest existing folder above it)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK)


def _unlink(f, why):
    try:
        f.unlink()
    except PermissionError as e:
        raise DataMissingError(
            f"{f} is {why} but cannot be removed ({e}): its folder is read-only. Make "
            f"{f.parent} writable, or copy the data to a writable folder and set {DATA_ENV} "
            "to it.") from e


def _bad_extracted(f, size):
    """Why the extracted file `f` is not the original (None if it looks right)."""
    got = f.stat().st_size
    if got != size:
        return f"{got:,} bytes, expected {size:,} (truncated or not the original)"
    with open(f, "rb") as fh:
        head = fh.read(8)
        kind = "labels" if "labels" in f.name else "images"
        if int.from_bytes(head[:4], "big") != MAGIC[kind]:
            return "not an idx file (wrong header)"
        if kind == "labels" and max(fh.read()) > 9:
            return "labels above 9 (the file is corrupt)"
    return None


def _check_extracted(raw):
    """Remove extracted files whose size or content is wrong, so that torchvision extracts them
    again from the archives (which it verifies by md5). A read-only folder gets a clear error."""
    for name, size in EXTRACTED_SIZES.items():
        f = raw / name
        if f.exists():
            why = _bad_extracted(f, size)
            if why:
                _unlink(f, f"damaged ({why})")


def _remove_partial(raw):
    """Delete half-downloaded archives (wrong md5), so the next try starts clean."""
    import torchvision
    from torchvision.datasets.utils import check_integrity

    for url, sum_ in torchvision.datasets.FashionMNIST.resources:
        f = raw / os.path.basename(url)
        if f.exists() and not check_integrity(str(f), sum_):
            _unlink(f, "a damaged archive (wrong md5)")


def load_data_fashion_mnist(batch_size, subset=None, resize=None, num_workers=None, seed=None):
    """Reference-style loaders: per-image ToTensor transforms in DataLoader workers.

    `subset` keeps the first `subset` training images and subset // 5 test images (quick runs);
    `seed` fixes the shuffling order. Returns (train_iter, test_iter).
    """
    check_positive_int(batch_size, "batch_size")
    check_positive_int(subset, "subset", allow_none=True)
    from torchvision import transforms
    trans = [transforms.ToTensor()]
    if resize:
        trans.insert(0, transforms.Resize(resize))
    trans = transforms.Compose(trans)
    train, test = fashion_mnist(True, trans), fashion_mnist(False, trans)
    if subset is not None:
        train = data.Subset(train, range(min(subset, len(train))))
        test = data.Subset(test, range(min(max(subset // 5, 1), len(test))))
    if num_workers is None:
        num_workers = min(4, os.cpu_count() or 1)
    kw = dict(num_workers=num_workers, persistent_workers=num_workers > 0)
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return (data.DataLoader(train, batch_size, shuffle=True, generator=g, **kw),
            data.DataLoader(test, batch_size, shuffle=False, **kw))


def load_tensors(train=True, subset=None, device="cpu"):
    """The whole split as two tensors (X float in [0, 1], shape (n, 1, 28, 28); y int64).

    No per-image transform: this is what a resident, on-device data pipeline starts from.
    """
    check_positive_int(subset, "subset", allow_none=True)
    ds = fashion_mnist(train)
    X, y = ds.data, ds.targets
    if subset is not None:
        n = subset if train else max(subset // 5, 1)
        X, y = X[:n], y[:n]
    X = X.to(device=device, dtype=torch.float32).div_(255).unsqueeze(1)
    return X, y.to(device)
