"""helpers' one atomic writer: what a killed writer leaves is removed by the next write of the
same file (and nothing else is), files get the umask's mode (not mkstemp's 0600), an overwrite
keeps the file's mode, and JSON round-trips."""
import os
import socket
import subprocess
import sys

import helpers


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
    helpers.atomic_save({"v": 1}, path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert dead.name not in left, "a dead writer's temporary file is removed"
    assert {alive.name, elsewhere.name, other.name, foreign.name, "ckpt.pt"} == set(left)


def test_files_get_the_umask_mode_and_an_overwrite_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        helpers.write_json(tmp_path / "m.json", {"v": 0})
        helpers.atomic_save({"v": 0}, tmp_path / "a.pt")
    finally:
        os.umask(old)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644, "not mkstemp's 0600"
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644
    os.chmod(tmp_path / "m.json", 0o640)
    helpers.write_json(tmp_path / "m.json", {"v": 1})
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o640
    assert helpers.read_json(tmp_path / "m.json") == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "m.json"]
