"""A text file written whole or not at all, with the standard library only: for the scripts that
run before the course's venv exists (lock_subset.py, under the system Python) or in the book's
venv, which has no torch (book_config.py); helpers' atomic_write imports torch with helpers."""
import os
import pathlib
import secrets


# Not helpers.atomic_write (the course's one writer): importing helpers imports torch, which the
# system Python and the book's venv that run these scripts do not have.
def write_text_atomic(out, text):
    """`text` into `out` through a uniquely named file in the same folder, then os.replace: a
    reader of `out` sees the old file or the new one, never a part (mode: the umask's)."""
    out = pathlib.Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
