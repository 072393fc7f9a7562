"""Fashion-MNIST loading: the seeded files load; missing data offline is a clear, fast error."""
import shutil
import socket
import time

import pytest
import torchvision

import helpers
from helpers import data


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
    assert helpers.data_dir() == tmp_path


def test_missing_data_offline_names_the_folder_and_files(monkeypatch, tmp_path):
    def offline(*args, **kwargs):
        raise OSError("network is unreachable (simulated)")
    monkeypatch.setattr(socket, "create_connection", offline)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    t0 = time.perf_counter()
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.fashion_mnist(train=True)
    assert time.perf_counter() - t0 < 60, "must fail fast offline, not hang"
    msg = str(e.value)
    assert str(tmp_path / "FashionMNIST" / "raw") in msg
    assert all(f in msg for f in data.FILES) and "COURSE_DATA" in msg


def test_a_corrupt_archive_is_removed_not_kept(monkeypatch, tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in data.FILES:
        shutil.copy(helpers.data_dir() / "FashionMNIST" / "raw" / f, raw / f)
    (raw / data.FILES[1]).write_bytes(b"half a download")
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError):
        helpers.fashion_mnist(train=True)
    assert not (raw / data.FILES[1]).exists(), "a half-written archive must not be left behind"
    assert (raw / data.FILES[0]).exists(), "good archives are kept"


# --- data-folder states (reliability row 6); always on copies in tmp_path, never the shared data

def copy_data(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    src = helpers.data_dir() / "FashionMNIST" / "raw"
    for f in data.FILES:
        shutil.copyfile(src / f, raw / f)
        shutil.copyfile(src / f[:-3], raw / f[:-3])
    return raw


def test_expected_sizes_are_those_of_the_verified_archives():
    import gzip
    raw = helpers.data_dir() / "FashionMNIST" / "raw"
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
    ds = helpers.fashion_mnist(train=False)
    assert ds.targets.max() == 9 and len(ds.targets) == 10000
    assert f.read_bytes() == b


def _read_only(monkeypatch, raw):
    """Simulate a read-only folder (chmod does not stop root): removing files in it fails."""
    real_unlink = data.Path.unlink

    def unlink(self, *a, **k):
        if self.parent == raw:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *a, **k)
    monkeypatch.setattr(data.Path, "unlink", unlink)


def test_a_damaged_file_in_a_read_only_folder_names_the_real_cause(monkeypatch, tmp_path):
    raw = copy_data(tmp_path)
    (raw / "t10k-labels-idx1-ubyte").write_bytes(b"short")
    _read_only(monkeypatch, raw)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.fashion_mnist(train=False)
    msg = str(e.value)
    assert "damaged" in msg and "read-only" in msg and "COURSE_DATA" in msg, msg
    assert "downloading it failed" not in msg


def test_a_corrupt_archive_that_cannot_be_removed_names_the_real_cause(monkeypatch, tmp_path):
    raw = copy_data(tmp_path)
    (raw / data.FILES[3]).write_bytes(b"half a download")
    (raw / data.FILES[3][:-3]).unlink()
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))
    _read_only(monkeypatch, raw)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.fashion_mnist(train=False)
    msg = str(e.value)
    assert "damaged archive" in msg and "read-only" in msg, msg


def test_a_missing_file_in_a_read_only_folder_says_read_only(monkeypatch, tmp_path):
    """Extraction needs to write: in a read-only folder the headline is that, not the network."""
    raw = copy_data(tmp_path)
    (raw / "t10k-images-idx3-ubyte").unlink()
    monkeypatch.setattr(data, "_writable", lambda folder: False)

    def no_write(*a, **k):
        raise PermissionError(13, "Permission denied (simulated read-only folder)")
    monkeypatch.setattr(torchvision.datasets.mnist, "extract_archive", no_write,
                        raising=False)
    monkeypatch.setattr(torchvision.datasets.utils, "extract_archive", no_write)
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("offline (simulated)")))
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    with pytest.raises(helpers.DataMissingError) as e:
        helpers.fashion_mnist(train=False)
    msg = str(e.value)
    assert "read-only" in msg and "COURSE_DATA" in msg and "downloading it failed" not in msg, msg
