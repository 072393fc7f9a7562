"""Fashion-MNIST loading: the seeded files load; missing data offline is a clear, fast error."""
import errno
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch

import helpers
from helpers import data
from helpers.data import data_dir, fashion_mnist


def test_loads_the_known_figures():
    X, y = helpers.load_tensors(train=True)
    assert X.shape == (60000, 1, 28, 28) and y.shape == (60000,)
    assert abs(X.mean().item() - 0.2860) < 1e-3 and abs(X.std().item() - 0.3530) < 1e-3
    assert y.bincount().tolist() == [6000] * 10
    Xt, yt = helpers.load_tensors(train=False, subset=500)
    assert Xt.shape == (100, 1, 28, 28) and float(Xt.max()) <= 1.0


def test_subset_loaders():
    train_iter, test_iter = helpers.load_data_fashion_mnist(64, subset=256, num_workers=0)
    assert len(train_iter.dataset) == 256 and len(test_iter.dataset) == 51
    X, y = next(iter(train_iter))
    assert X.shape == (64, 1, 28, 28) and y.shape == (64,)


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    assert data_dir() == tmp_path


def test_missing_data_offline_names_the_folder_and_files(monkeypatch, tmp_path):
    def offline(*args, **kwargs):
        raise OSError("network is unreachable (simulated)")
    monkeypatch.setattr(socket, "create_connection", offline)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    t0 = time.perf_counter()
    with pytest.raises(helpers.DataMissingError) as e:
        fashion_mnist(train=True)
    assert time.perf_counter() - t0 < 60, "must fail fast offline, not hang"
    msg = str(e.value)
    assert str(tmp_path / "FashionMNIST" / "raw") in msg
    assert all(f in msg for f in data.FILES) and "COURSE_DATA" in msg


def test_a_corrupt_archive_is_removed_not_kept(monkeypatch, tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in data.FILES:
        shutil.copy(data_dir() / "FashionMNIST" / "raw" / f, raw / f)
    (raw / data.FILES[1]).write_bytes(b"half a download")
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError):
        fashion_mnist(train=True)
    assert not (raw / data.FILES[1]).exists(), "a half-written archive must not be left behind"
    assert (raw / data.FILES[0]).exists(), "good archives are kept"


# --- data-folder states (reliability row 6); always on copies in tmp_path, never the shared data

def copy_data(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    src = data_dir() / "FashionMNIST" / "raw"
    for f in data.FILES:
        shutil.copyfile(src / f, raw / f)
        shutil.copyfile(src / f[:-3], raw / f[:-3])
    return raw


def test_expected_sizes_are_those_of_the_verified_archives():
    import gzip
    raw = data_dir() / "FashionMNIST" / "raw"
    for name, size in data.EXTRACTED_SIZES.items():
        assert (raw / name).stat().st_size == size
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz") as f:
        assert len(f.read()) == data.EXTRACTED_SIZES["t10k-labels-idx1-ubyte"]


@pytest.mark.parametrize("damage", ["truncated", "wrong labels"])
def test_a_damaged_extracted_file_is_extracted_again_offline(monkeypatch, tmp_path, damage):
    """A truncated extracted file, or one of the right size whose labels are out of range, is
    replaced from the verified archive (no network needed) and the data load correctly."""
    raw = copy_data(tmp_path)
    f = raw / "t10k-labels-idx1-ubyte"
    b = f.read_bytes()
    f.write_bytes(b[:1000] if damage == "truncated" else b[:8] + bytes([200]) * (len(b) - 8))
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    ds = fashion_mnist(train=False)
    assert ds.targets.max() == 9 and len(ds.targets) == 10000
    assert f.read_bytes() == b


def _read_only(monkeypatch, raw, code=errno.EROFS):
    """Simulate a read-only folder (chmod does not stop root): creating, replacing or removing
    a file in `raw` fails with `code` (EROFS: a read-only mount; EACCES: no permission)."""
    def refuse(path):
        raise OSError(code, os.strerror(code), str(path))

    def inside(path):
        return Path(path).parent == raw
    real = {f: getattr(os, f) for f in ("open", "unlink", "replace", "access")}

    def open_(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real["open"](path, flags, *a, **k)

    def unlink(path, *a, **k):
        return refuse(path) if inside(path) else real["unlink"](path, *a, **k)

    def replace(src, dst, *a, **k):
        return refuse(dst) if inside(dst) else real["replace"](src, dst, *a, **k)

    def access(path, mode, *a, **k):
        return False if Path(path) == raw and mode & os.W_OK else real["access"](path, mode)
    for name, f in (("open", open_), ("unlink", unlink), ("replace", replace),
                    ("access", access)):
        monkeypatch.setattr(os, name, f)


def offline(monkeypatch):
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))


READ_ONLY = pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["EROFS", "EACCES"])


@READ_ONLY
@pytest.mark.parametrize("damage", ["truncated", "right size, wrong bytes"])
def test_a_damaged_file_in_a_read_only_folder_names_the_real_cause(monkeypatch, tmp_path,
                                                                   code, damage):
    """A read-only mount (EROFS), not only a folder without permission, says which
    file is damaged and that the folder is read-only; never a bare OSError."""
    raw = copy_data(tmp_path)
    f = raw / "t10k-labels-idx1-ubyte"
    b = f.read_bytes()
    f.write_bytes(b"short" if damage == "truncated" else b[:8] + b[9:] + b[8:9])
    _read_only(monkeypatch, raw, code)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        fashion_mnist(train=False)
    msg = str(e.value)
    assert str(f) in msg and "damaged" in msg and "read-only" in msg and "COURSE_DATA" in msg
    assert "downloading it failed" not in msg


@READ_ONLY
def test_a_corrupt_archive_that_cannot_be_removed_names_the_real_cause(monkeypatch, tmp_path,
                                                                       code):
    raw = copy_data(tmp_path)
    (raw / data.FILES[3]).write_bytes(b"half a download")
    (raw / data.FILES[3][:-3]).unlink()
    offline(monkeypatch)
    _read_only(monkeypatch, raw, code)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        fashion_mnist(train=False)
    msg = str(e.value)
    assert "damaged archive" in msg and "read-only" in msg and data.FILES[3] in msg, msg


@READ_ONLY
def test_a_missing_file_in_a_read_only_folder_says_read_only(monkeypatch, tmp_path, code):
    """Extraction needs to write: in a read-only folder the headline is that, not the network."""
    raw = copy_data(tmp_path)
    (raw / "t10k-images-idx3-ubyte").unlink()
    offline(monkeypatch)
    _read_only(monkeypatch, raw, code)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        fashion_mnist(train=False)
    msg = str(e.value)
    assert "read-only" in msg and "COURSE_DATA" in msg and "downloading it failed" not in msg, msg
    assert "t10k-images-idx3-ubyte is missing" in msg


def test_a_complete_read_only_folder_loads(monkeypatch, tmp_path):
    """Nothing to change, nothing to write: the lock and the md5 record are optional."""
    raw = copy_data(tmp_path)
    _read_only(monkeypatch, raw)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    assert len(fashion_mnist(train=False)) == 10000
    assert not (raw / data.VERIFIED).exists() and not (raw / ".lock").exists()


# --- the extracted files' md5s and a damaged archive named ---

@pytest.mark.parametrize("damage", ["random pixels", "labels shifted"])
def test_right_size_wrong_bytes_is_detected_and_extracted_again(monkeypatch, tmp_path, damage):
    """Size and header right, content not: the md5 tells, and the archive restores it."""
    raw = copy_data(tmp_path)
    name = "t10k-images-idx3-ubyte" if damage == "random pixels" else "t10k-labels-idx1-ubyte"
    f = raw / name
    good = f.read_bytes()
    head = 16 if "images" in name else 8
    body = (torch.randint(0, 256, (len(good) - head,), dtype=torch.uint8).numpy().tobytes()
            if damage == "random pixels" else bytes((b + 1) % 10 for b in good[head:]))
    f.write_bytes(good[:head] + body)
    offline(monkeypatch)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    ds = fashion_mnist(train=False)
    assert f.read_bytes() == good
    assert abs(ds.data.float().mean().item() / 255 - 0.2868) < 1e-3


def test_a_verified_file_is_not_hashed_again_until_it_changes(monkeypatch, tmp_path):
    """The md5s cost a load about 0.5 s: they are checked once, recorded with each file's size,
    times and inode, and checked again only when one of those changes."""
    raw = copy_data(tmp_path)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    fashion_mnist(train=False)                       # hashes the four files once
    hashed = []
    real_md5 = data._md5
    monkeypatch.setattr(data, "_md5", lambda f: hashed.append(f.name) or real_md5(f))
    fashion_mnist(train=False)
    assert hashed == [], "a verified, unchanged file was hashed again"
    f = raw / "t10k-labels-idx1-ubyte"
    b = bytearray(f.read_bytes())
    b[100] = (b[100] + 1) % 10                               # changed in place, same size
    f.write_bytes(bytes(b))
    offline(monkeypatch)
    ds = fashion_mnist(train=False)
    assert hashed == ["t10k-labels-idx1-ubyte"] and ds.targets[92] == (b[100] - 1) % 10


def test_a_damaged_archive_is_named_and_said_to_be_removed(monkeypatch, tmp_path):
    """One flipped byte in an archive whose extracted file is missing, offline."""
    raw = copy_data(tmp_path)
    gz = raw / data.FILES[3]
    b = bytearray(gz.read_bytes())
    b[2000] ^= 0xFF
    gz.write_bytes(bytes(b))
    (raw / data.FILES[3][:-3]).unlink()
    offline(monkeypatch)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        fashion_mnist(train=False)
    msg = str(e.value)
    assert f"{gz} was damaged" in msg and "has been removed" in msg, msg
    assert not gz.exists()


# --- several processes loading a fresh folder at once ---

def test_ranks_loading_a_fresh_folder_at_once_all_load(tmp_path):
    """Three ranks (helpers.launch) load a folder holding only the four .gz archives at the same
    moment, three times over, then its tensors (decoding them into a missing cache): every load
    succeeds with the known figures. Before the lock, a rank deleted the file another was still
    extracting (8 of 12 loads failed)."""
    import reliability_ranks
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in data.FILES:   # read only: hard links where the file system allows
        src = data_dir() / "FashionMNIST" / "raw" / f
        try:
            os.link(src, raw / f)
        except OSError:
            shutil.copyfile(src, raw / f)
    out = helpers.launch(reliability_ranks.load_at_once, 3, dict(root=str(tmp_path), trials=3,
                                                          train=True), timeout=240, quiet=True)
    known = reliability_ranks.summary(fashion_mnist(train=True))   # the course's own copy
    bad = [(r, t, what, got) for r, trials in enumerate(out) for t, loads in enumerate(trials)
           for what, got in loads.items() if got != known]
    assert not bad, f"{len(bad)} of {3 * 3 * 2} loads failed, e.g. {bad[0]}"
    assert all(len(loads) == 2 for trials in out for loads in trials)
    assert reliability_ranks.summary(fashion_mnist(False, root=tmp_path)) == \
        reliability_ranks.summary(fashion_mnist(False))


# --- a path where a folder should be, or a folder where a file should be: named as such --------

@pytest.mark.parametrize("where", ["COURSE_DATA", "FashionMNIST", "raw"])
def test_a_file_where_the_data_folder_should_be_is_named(monkeypatch, tmp_path, where):
    """Not "its folder is read-only" (which sends the reader to check permissions)."""
    root = tmp_path / "data"
    path = {"COURSE_DATA": root, "FashionMNIST": root / "FashionMNIST",
            "raw": root / "FashionMNIST" / "raw"}[where]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a folder")
    monkeypatch.setenv("COURSE_DATA", str(root))
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.load_tensors(True, subset=10)
    msg = str(e.value)
    assert f"{path} is a file, not a folder" in msg and "read-only" not in msg, msg
    assert ("point COURSE_DATA at a folder" if where == "COURSE_DATA" else "remove it") in msg


def test_a_folder_where_a_data_file_should_be_is_named(monkeypatch, tmp_path):
    raw = copy_data(tmp_path)
    for name in (data.FILES[1][:-3], data.FILES[1]):     # the extracted file and its archive
        (raw / name).unlink()
        (raw / name).mkdir()
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.load_tensors(True, subset=10)
    msg = str(e.value)
    assert f"{raw / data.FILES[1][:-3]} is a folder, not the data file" in msg, msg
    assert "rm -r" in msg
    assert (raw / data.FILES[1][:-3]).is_dir(), "a reader's folder is never deleted"
