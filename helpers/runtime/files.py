"""Files a crash cannot destroy: THE ONLY atomic writer. Every file the course writes goes here.

`atomic_write(path, write)` lets `write(f)` fill a temporary file in the SAME folder, flushes and
fsyncs it, and `os.replace` swaps it in: a kill at any moment leaves either the old file or the
new one, never half of one (`os.replace` is atomic within one file system; a temporary file
elsewhere would not be). The temporary file is named `.NAME.HOST.PID.XXXX.tmp`, so the next write
of NAME removes what a killed writer left (its process is gone), and it is created with the
umask's mode (as open() would), keeping the mode of the file it replaces.
"""
import errno
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "atomic_save", "write_json", "read_json"]

_STALE_ELSEWHERE_S = 24 * 3600   # a temporary file from another machine: removed after a day


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:              # e.g. PermissionError: it exists, owned by someone else
        return True
    return True


def _remove_stale(path, host):
    """Delete the temporary files that killed writers of `path` left behind: from this machine
    when their process is gone, from another machine (a shared file system) after a day."""
    prefix = f".{path.name}."
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for e in entries:
        if not (e.name.startswith(prefix) and e.name.endswith(".tmp")):
            continue
        parts = e.name[len(prefix):-len(".tmp")].rsplit(".", 3)
        if len(parts) != 3 or not parts[1].isdigit():
            continue                                  # not one of ours: leave it
        who, pid = parts[0], int(parts[1])
        try:
            stale = (not _alive(pid)) if who == host else \
                time.time() - e.stat().st_mtime > _STALE_ELSEWHERE_S
            if stale and pid != os.getpid():
                os.unlink(e.path)
        except OSError:
            pass                                      # another writer cleaned it first


def _no_space(e):
    """True if `e`, or an error it arose from, is a full disk or an exceeded quota."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    return False


def _open_temporary(path, host):
    """A new temporary file next to `path`, created with mode 0666 & ~umask (what open() gives;
    mkstemp would give 0600). An error names `path` (the temporary file is ours to know)."""
    while True:
        tmp = path.parent / f".{path.name}.{host}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            why = {errno.ENOENT: f"the folder {path.parent} does not exist: create it first",
                   errno.ENOTDIR: f"{path.parent} is not a folder",
                   errno.EACCES: f"the folder {path.parent} is not writable",
                   errno.EROFS: f"the folder {path.parent} is on a read-only file system"}
            raise type(e)(e.errno, f"cannot write the file ("
                          f"{why.get(e.errno, os.strerror(e.errno or 0))})", str(path)) from None


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], mode: str = "wb",
                 durable: bool = True) -> Path:
    """Write a file all at once or not at all: `write(f)` fills a temporary file next to `path`,
    which is flushed, fsynced and renamed over `path`. On any error the old file stays.
    durable=False skips the fsyncs (a progress note: whole or absent, not worth a disk flush).
    Text modes write UTF-8 whatever the locale (as nbformat.write and the course's readers do)."""
    path = Path(path)
    host = socket.gethostname().replace(".", "-") or "host"
    _remove_stale(path, host)
    tmp, fd = _open_temporary(path, host)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            try:
                os.chmod(tmp, os.stat(path).st_mode & 0o7777)   # an overwrite keeps its mode
            except FileNotFoundError:
                pass
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())   # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if _no_space(e):   # torch.save turns ENOSPC into "enforce fail ... unexpected pos"
            kept = "the old file is kept" if path.exists() else "nothing was written"
            raise OSError(errno.ENOSPC, f"no space left on device while writing {path} ({kept}):"
                          f" free some space on {path.parent}'s disk, or write elsewhere") from e
        raise
    if durable:
        try:   # make the rename itself durable (not possible on every platform)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
    return path


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save(obj, path), atomically."""
    import torch
    return atomic_write(path, lambda f: torch.save(obj, f))


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """json.dump(obj) to `path`, atomically, ending in a newline (as text files do)."""
    def dump(f):
        json.dump(obj, f, indent=indent)
        f.write("\n")
    return atomic_write(path, dump, mode="w")


def read_json(path: str | os.PathLike) -> Any:
    """What write_json wrote (a whole file: atomic writes never leave half of one)."""
    with open(path) as f:
        return json.load(f)
