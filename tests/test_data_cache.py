"""load_tensors' cache of the decoded splits: a warm one spares a process torchvision's import;
a stale, damaged or unwritable one never changes what a load returns. Always on copies of the
data in tmp_path, never the shared folder."""
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_data import copy_data

import helpers
from helpers import data, decoded_cache
from helpers.data import fashion_mnist

REPO = Path(__file__).resolve().parent.parent


def decoded(root, train, n=None):
    """What load_tensors returned before the cache: torchvision's decoding, as floats."""
    ds = fashion_mnist(train, root=root)
    X, y = ds.data[:n], ds.targets[:n]
    return X.float().div(255).unsqueeze(1), y


def same(got, want):
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
               for a, b in zip(got, want, strict=True))


def test_a_fresh_process_loads_the_warm_cache_without_torchvision(monkeypatch, tmp_path):
    """The point of the cache: a rank's process never imports torchvision (1.4 s of CPU)."""
    copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    helpers.load_tensors(True, 10), helpers.load_tensors(False, 10)   # warms both splits
    out = tmp_path / "out.pt"
    code = textwrap.dedent(f"""
        import sys, torch, helpers
        got = [*helpers.load_tensors(True), *helpers.load_tensors(False, 512)]
        assert 'torchvision' not in sys.modules, 'a warm cache still imported torchvision'
        torch.save(got, {str(out)!r})
    """)
    env = dict(os.environ, COURSE_DATA=str(tmp_path), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got = torch.load(out, weights_only=True)
    assert same(got, [*decoded(tmp_path, True), *decoded(tmp_path, False, 102)])


def test_a_changed_raw_file_rebuilds_the_cache(monkeypatch, tmp_path):
    """The cache names the stat keys of the raw files it came from; a raw file whose key
    changed (here: only its mtime; the md5 check passes again) is decoded anew."""
    raw = copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    helpers.load_tensors(False)
    keys = torch.load(decoded_cache.cache_path(tmp_path, False), weights_only=True)["keys"]
    ds = fashion_mnist(False, root=tmp_path)
    images, targets = ds.data, ds.targets
    decoded_cache.write(tmp_path, False, images, (targets + 1) % 10, keys)   # planted labels
    assert torch.equal(helpers.load_tensors(False)[1], (targets + 1) % 10), "cache not used"
    f = raw / "t10k-labels-idx1-ubyte"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert same(helpers.load_tensors(False), decoded(tmp_path, False))
    saved = torch.load(decoded_cache.cache_path(tmp_path, False), weights_only=True)
    assert saved["keys"][f.name] == data._stat_key(f) and torch.equal(saved["targets"], targets)


def _damage(path, how):
    b = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(b[:len(b) // 3])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "one byte changed":                # in the middle of the images
        b[len(b) // 2] ^= 0x5A
        path.write_bytes(b)
    elif how == "one image short":
        saved = torch.load(path, weights_only=True)
        decoded_cache.write(path.parent.parent.parent, False, saved["images"][:-1],
                            saved["targets"][:-1], saved["keys"])


@pytest.mark.parametrize("how", ["truncated", "empty", "one byte changed", "one image short"])
def test_a_damaged_cache_is_rebuilt(monkeypatch, tmp_path, how):
    """Whatever happened to the file, the load returns torchvision's decoding and the cache is
    whole again; never an error, never the damaged tensors."""
    copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    helpers.load_tensors(False)
    _damage(decoded_cache.cache_path(tmp_path, False), how)
    assert same(helpers.load_tensors(False), decoded(tmp_path, False))
    keys = {n: data._stat_key(tmp_path / "FashionMNIST" / "raw" / n)
            for n in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    assert decoded_cache.read(tmp_path, False, keys) is not None, "the cache was not rebuilt"


def _read_only(monkeypatch, root):
    """Nothing under `root` can be created, replaced or removed (chmod does not stop root)."""
    real = {f: getattr(os, f) for f in ("open", "mkdir", "replace", "unlink")}

    def inside(path):
        return Path(path).resolve().is_relative_to(root)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def open_(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real["open"](path, flags, *a, **k)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: refuse(p) if inside(p)
                        else real["mkdir"](p, *a, **k))
    monkeypatch.setattr(os, "replace", lambda s, d, *a, **k: refuse(d) if inside(d)
                        else real["replace"](s, d, *a, **k))
    monkeypatch.setattr(os, "unlink", lambda p, *a, **k: refuse(p) if inside(p)
                        else real["unlink"](p, *a, **k))


@pytest.mark.parametrize("warm", [False, True], ids=["no cache", "warm cache"])
def test_a_read_only_data_folder_loads(monkeypatch, tmp_path, warm):
    """A read-only copy of the data (a shared mount) loads: the cache is written where it can be
    and read where it is, never a reason to fail."""
    copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    if warm:
        helpers.load_tensors(False)
    cache = decoded_cache.cache_path(tmp_path, False)
    before = cache.stat().st_ino if warm else None
    _read_only(monkeypatch, tmp_path.resolve())
    assert same(helpers.load_tensors(False, 500), decoded(tmp_path, False, 100))
    assert (cache.stat().st_ino if cache.exists() else None) == before


@pytest.mark.parametrize("warm", [False, True], ids=["no cache", "warm cache"])
def test_a_subset_is_the_first_images_as_before(monkeypatch, tmp_path, warm):
    """subset keeps the first `subset` training images and subset // 5 test images."""
    copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    if warm:
        helpers.load_tensors(True, 1), helpers.load_tensors(False, 1)
    assert same(helpers.load_tensors(True, 512), decoded(tmp_path, True, 512))
    assert same(helpers.load_tensors(False, 512), decoded(tmp_path, False, 102))
    assert same(helpers.load_tensors(False, 3), decoded(tmp_path, False, 1))
    assert decoded_cache.cache_path(tmp_path, True).exists()
