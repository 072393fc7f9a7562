"""Fashion-MNIST loading: the seeded files load; missing data offline is a clear, fast error."""
import shutil
import socket
import time

import pytest

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
