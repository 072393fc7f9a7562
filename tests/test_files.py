"""helpers' one atomic writer: what a killed writer leaves is removed by the next write of the
same file (and nothing else is), files get the umask's mode (not mkstemp's 0600), an overwrite
keeps the file's mode, and JSON round-trips."""
import os
import socket
import subprocess
import sys

import pytest

import helpers
from helpers.runtime.files import atomic_save, read_json


def _host():
    return socket.gethostname().replace(".", "-") or "host"


def _dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_next_write_removes_what_killed_writers_left(tmp_path):
    path = tmp_path / "ckpt.pt"
    dead = tmp_path / f".ckpt.pt.{_host()}.{_dead_pid()}.abcd1234.tmp"
    alive = tmp_path / f".ckpt.pt.{_host()}.{os.getppid()}.abcd1234.tmp"   # a writer at work
    elsewhere = tmp_path / f".ckpt.pt.other-host.{_dead_pid()}.abcd1234.tmp"   # fresh, remote
    other = tmp_path / f".other.pt.{_host()}.{_dead_pid()}.abcd1234.tmp"   # another file's
    foreign = tmp_path / ".ckpt.pt.notours.tmp"
    for p in (dead, alive, elsewhere, other, foreign):
        p.write_bytes(b"half a checkpoint")
    atomic_save({"v": 1}, path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert dead.name not in left, "a dead writer's temporary file is removed"
    assert {alive.name, elsewhere.name, other.name, foreign.name, "ckpt.pt"} == set(left)


def test_files_get_the_umask_mode_and_an_overwrite_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        helpers.write_json(tmp_path / "m.json", {"v": 0})
        atomic_save({"v": 0}, tmp_path / "a.pt")
    finally:
        os.umask(old)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644, "not mkstemp's 0600"
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644
    os.chmod(tmp_path / "m.json", 0o640)
    helpers.write_json(tmp_path / "m.json", {"v": 1})
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o640
    assert read_json(tmp_path / "m.json") == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "m.json"]


def test_a_full_disk_says_so_and_keeps_the_old_file(tmp_path, monkeypatch):
    """torch.save on a full disk raises "enforce fail ... unexpected pos"; the writer
    says "no space left on device" instead, and the old file still loads. The temporary file is
    made to write into /dev/full, where every write fails with ENOSPC (as on a full disk)."""
    import errno

    import pytest
    import torch

    from helpers.runtime import files
    path = tmp_path / "snap.pt"
    atomic_save({"w": torch.zeros(3)}, path)
    real = files._open_temporary

    def full(p, host):
        tmp, fd = real(p, host)
        os.close(fd)
        return tmp, os.open("/dev/full", os.O_WRONLY)
    monkeypatch.setattr(files, "_open_temporary", full)
    with pytest.raises(OSError) as e:
        atomic_save({"w": torch.ones(100_000)}, path)
    assert e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert f"no space left on device while writing {path}" in msg and "old file is kept" in msg
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.zeros(3))
    assert os.listdir(tmp_path) == ["snap.pt"], "the temporary file is removed"


def test_an_error_names_the_file_being_written_not_its_temporary(tmp_path):
    """A missing or read-only folder: the error names the target and what to do; the hidden
    temporary file (.NAME.HOST.PID.XXXX.tmp) is an implementation detail."""
    target = tmp_path / "no" / "such" / "c.pt"
    with pytest.raises(FileNotFoundError) as e:
        atomic_save({"a": 1}, target)
    msg = str(e.value)
    assert str(target) in msg and ".tmp" not in msg and "does not exist" in msg, msg
    assert e.value.filename == str(target)
    plain = tmp_path / "a_file"
    plain.write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        helpers.write_json(plain / "m.json", {})
    assert str(plain / "m.json") in str(e.value) and ".tmp" not in str(e.value)
