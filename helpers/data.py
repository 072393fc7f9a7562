"""Fashion-MNIST through torchvision, into a writable data folder (COURSE_DATA overrides it).

Several processes (the ranks of one job) may load a fresh folder at once, so the files are
prepared under a lock (`fcntl.flock` on raw/.lock) and every extracted file appears at once
(written next to its name, then renamed: runtime.files.atomic_write): no process ever sees, or
deletes, a file that another is still writing. An extracted file is checked against the md5 of
the original; the check is remembered in raw/.verified.json (keyed by the file's size, times and
inode), so only the first load after a change pays for it. load_tensors keeps what torchvision
decoded beside raw/ (decoded_cache), so later processes load it without importing torchvision.
"""
import errno
import gzip
import hashlib
import json
import os
import shlex
import socket
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils import data

from . import decoded_cache
from .runtime.files import atomic_write
from .validate import validate_positive_int

__all__ = ["DataMissingError", "data_dir", "ensure_data", "fashion_mnist",
           "load_data_fashion_mnist", "load_tensors"]

DATA_ENV = "COURSE_DATA"
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# Byte sizes and md5s of the four extracted (gunzipped) files, computed once from torchvision's
# verified archives: len(gzip.open(f).read()) and its md5 for each .gz (a 16-byte header +
# 28*28 bytes per image; an 8-byte header + 1 byte per label).
EXTRACTED_SIZES = {"train-images-idx3-ubyte": 47040016, "train-labels-idx1-ubyte": 60008,
                   "t10k-images-idx3-ubyte": 7840016, "t10k-labels-idx1-ubyte": 10008}
EXTRACTED_MD5 = {"train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                 "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
                 "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
                 "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"}
MAGIC = {"images": 2051, "labels": 2049}   # the idx format's first 4 bytes (big-endian)
LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat",
          "sandal", "shirt", "sneaker", "bag", "ankle boot")
VERIFIED = ".verified.json"   # {name: [size, mtime_ns, ctime_ns, inode]} of md5-checked files
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_checked = {}                 # the same record, for folders where it cannot be written


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


def ensure_data(root=None):
    """The data folder, with Fashion-MNIST's files checked, extracted or downloaded there (one
    process at a time); else DataMissingError naming what is wrong and the fix. What a script
    calls before any work; fashion_mnist calls it too."""
    return _ensure(root)[0]


def _ensure(root):
    """ensure_data, also returning the record of the verified files ({name: stat key})."""
    root = Path(root) if root is not None else data_dir()
    raw = root / "FashionMNIST" / "raw"
    with _locked(raw):
        record = _prepare(raw)
    return root, record


def fashion_mnist(train=True, transform=None, root=None):
    """The torchvision dataset, downloaded on first use (a seeded raw/ folder skips the network)."""
    import torchvision  # imported here: worker processes that never load data start faster
    from torchvision import transforms
    root = ensure_data(root)
    return torchvision.datasets.FashionMNIST(
        root=str(root), train=train, download=False, transform=transform or transforms.ToTensor())


# ---- preparing the folder: under the lock, every file whole or absent ---------------------
@contextmanager
def _locked(raw):
    """Hold an exclusive lock on raw/.lock. Where it cannot be created (a read-only folder,
    where nobody can change the files either) or there is no fcntl (Windows), go on without."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    fd = None
    if fcntl is not None:
        try:
            raw.mkdir(parents=True, exist_ok=True)
            fd = os.open(raw / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            try:
                fd = os.open(raw / ".lock", os.O_RDONLY)   # someone else's lock file
            except OSError:
                fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)   # released when fd closes or the process dies
            except OSError:                      # a file system without locks (some NFS)
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _prepare(raw):
    """Make the four extracted files the originals: a damaged one is removed, a missing one is
    extracted from its archive, a missing or damaged archive is downloaded (torchvision checks
    its md5). Errors say which file, what is wrong with it and what to do."""
    if not raw.is_dir():
        _mkdir(raw)
    record, changed = _read_record(raw), False
    for name in EXTRACTED_SIZES:
        f = raw / name
        _not_a_folder(f)
        if f.exists():
            if _stat_key(f) == record.get(name):
                continue
            why = _bad_extracted(f)
            if why is None:
                record[name], changed = _stat_key(f), True
                continue
            _unlink(f, f"is damaged ({why})")
        _extract(_archive(raw, name + ".gz"), f)
        record[name], changed = _stat_key(f), True
    if changed:
        _write_record(raw, record)
    return record


def _mkdir(raw):
    try:
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _not_a_folder_on_the_way(raw, e)
        why = ("its folder is read-only, so Fashion-MNIST cannot be downloaded there"
               if e.errno in READ_ONLY else "so Fashion-MNIST cannot be downloaded there")
        raise DataMissingError(
            f"cannot create {raw} ({e}): {why}. Set {DATA_ENV} to a writable folder (or one "
            f"whose FashionMNIST/raw/ holds {', '.join(FILES)}).") from e


def _not_a_folder_on_the_way(raw, e):
    """The error for a file where the data folder, FashionMNIST/ or raw/ should be."""
    root = raw.parent.parent
    for folder in (root, raw.parent, raw):
        if folder.exists() and not folder.is_dir():
            env = os.environ.get(DATA_ENV)
            if folder == root and env and Path(env).expanduser() == root:
                raise DataMissingError(f"{DATA_ENV}={folder} is a file, not a folder: point "
                                       f"{DATA_ENV} at a folder (it need not exist yet)") from e
            raise DataMissingError(f"{folder} is a file, not a folder: remove it (it is not "
                                   f"part of the data), or set {DATA_ENV} to another "
                                   "folder") from e


def _not_a_folder(f):
    """Refuse a folder where a data file should be (never deleted: it is not ours)."""
    if f.is_dir():
        raise DataMissingError(
            f"{f} is a folder, not the data file {f.name}: remove it (rm -r "
            f"{shlex.quote(str(f))}) and load again, or set {DATA_ENV} to another folder")


def _read_only(path, e, problem, cannot):
    """The error for a file that must change in a folder that cannot (EROFS, EACCES, EPERM)."""
    return DataMissingError(
        f"{path} {problem} but cannot be {cannot}: its folder is read-only ({e}). Make "
        f"{path.parent} writable, or copy the data to a writable folder and set {DATA_ENV} to "
        "that folder.")


def _writable(folder):
    """True if files can be created in `folder`."""
    return os.access(folder, os.W_OK | os.X_OK)


def _unlink(f, problem):
    try:
        f.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno not in READ_ONLY:
            raise
        raise _read_only(f, e, problem, "removed") from e


def _stat_key(f):
    st = f.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_record(raw):
    try:
        with open(raw / VERIFIED) as fh:
            record = json.load(fh)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return dict(_checked.get(str(raw), {}))


def _write_record(raw, record):
    _checked[str(raw)] = dict(record)
    try:
        atomic_write(raw / VERIFIED, lambda fh: json.dump(record, fh), mode="w", durable=False)
    except OSError:
        pass   # a read-only folder: the md5s are checked again in the next process


def _md5(f):
    h = hashlib.md5(usedforsecurity=False)
    with open(f, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _bad_extracted(f):
    """Why the extracted file `f` is not the original (None if it is)."""
    size = EXTRACTED_SIZES[f.name]
    got = f.stat().st_size
    if got != size:
        return f"{got:,} bytes, expected {size:,} (truncated or not the original)"
    with open(f, "rb") as fh:
        kind = "labels" if "labels" in f.name else "images"
        if int.from_bytes(fh.read(4), "big") != MAGIC[kind]:
            return "not an idx file (wrong header)"
    if _md5(f) != EXTRACTED_MD5[f.name]:
        return "the right size, but its bytes are not the original's (wrong md5)"
    return None


def _archive(raw, name):
    """The path of the verified archive `name` in `raw`; downloaded if missing or damaged."""
    import torchvision
    from torchvision.datasets.utils import check_integrity, download_url
    ds = torchvision.datasets.FashionMNIST
    md5 = dict(ds.resources)[name]
    path = raw / name
    _not_a_folder(path)
    damaged = path.exists()
    if damaged:
        if check_integrity(str(path), md5):
            return path
        _unlink(path, "is a damaged archive (wrong md5)")
    if not _writable(raw):
        raise _read_only(path, OSError(errno.EROFS, os.strerror(errno.EROFS)),
                         "is missing", "downloaded there")
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)   # torchvision's urllib calls have none: never hang offline
    try:
        for mirror in ds.mirrors:
            try:
                download_url(mirror + name, str(raw), name, md5)
                return path
            except Exception as e:  # URLError, timeouts, md5 mismatch: the file is not here
                error = e
    finally:
        socket.setdefaulttimeout(old_timeout)
    _unlink(path, "is a partial download")
    what = (f"{path} was damaged (its md5 is not the original's) and has been removed; "
            "downloading it again failed" if damaged else
            f"Fashion-MNIST is not in {raw} ({name} is missing) and downloading it failed")
    raise DataMissingError(
        f"{what} ({type(error).__name__}: {error}). Put the four original files "
        f"{', '.join(FILES)} in {raw} (torchvision checks their md5s), or set {DATA_ENV} to a "
        "folder whose FashionMNIST/raw/ holds them.") from error


def _extract(archive, f):
    """Gunzip `archive` into `f` at once (a temporary file renamed over it), checking the md5."""
    def write(out):
        h = hashlib.md5(usedforsecurity=False)
        with gzip.open(archive, "rb") as src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != EXTRACTED_MD5[f.name]:
            raise DataMissingError(f"{archive} passed torchvision's md5 check but does not "
                                   f"extract to the original {f.name}: delete it and retry")
    try:   # no fsync (5x faster on a busy disk): a power cut leaves it short, and the size
        atomic_write(f, write, durable=False)   # check then sends it back to its archive
    except OSError as e:
        if e.errno not in READ_ONLY:
            raise
        raise _read_only(f, e, "is missing", "extracted from its archive there") from e


def load_data_fashion_mnist(batch_size, subset=None, resize=None, num_workers=None, seed=None):
    """Reference-style loaders: per-image ToTensor transforms in DataLoader workers.

    `subset` keeps the first `subset` training images and subset // 5 test images (quick runs);
    `seed` fixes the shuffling order. Returns (train_iter, test_iter).
    """
    validate_positive_int(batch_size, "batch_size")
    validate_positive_int(subset, "subset", allow_none=True)
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
    validate_positive_int(subset, "subset", allow_none=True)
    X, y = _decoded(train)
    if subset is not None:
        n = subset if train else max(subset // 5, 1)
        X, y = X[:n], y[:n]
    X = X.to(device=device, dtype=torch.float32).div_(255).unsqueeze(1)
    return X, y.to(device)


def _decoded(train):
    """The split's uint8 images and int64 labels: from the folder's cache of them if it was
    decoded from these verified files (no torchvision import: 1.4 s of CPU less per process),
    else decoded by torchvision, under the lock (one rank decodes, the others then read it)."""
    root, record = _ensure(None)
    prefix = "train" if train else "t10k"
    keys = {name: record[name] for name in EXTRACTED_SIZES if name.startswith(prefix)}
    if (hit := decoded_cache.read(root, train, keys)) is not None:
        return hit
    with _locked(root / "FashionMNIST" / "raw"):
        if (hit := decoded_cache.read(root, train, keys)) is not None:
            return hit
        import torchvision
        ds = torchvision.datasets.FashionMNIST(root=str(root), train=train, download=False)
        decoded_cache.write(root, train, ds.data, ds.targets, keys)
    return ds.data, ds.targets
