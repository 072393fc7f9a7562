"""Every pytest run in this repository: what it starts (notebook kernels, ranks, torchrun, the
scripts) keeps its temporary files in one folder, removed when the run ends. nbval stops each
kernel with SIGKILL, which skips what the kernel would remove at exit (the fork server's pymp-*
socket folder, a TemporaryDirectory a cell still holds): without this they pile up in /tmp."""
import os
import shutil
import tempfile

_MADE = "COURSE_TEST_TMPDIR"   # set: an outer run (or the xdist controller) made the folder


def pytest_configure(config):
    if os.environ.get(_MADE):
        return
    tempfile.gettempdir()   # this process keeps its own (pytest's tmp_path stays where it was)
    path = tempfile.mkdtemp(prefix="course-tests-")
    config._course_tmpdir = path, os.environ.get("TMPDIR")
    os.environ[_MADE] = os.environ["TMPDIR"] = path   # inherited by all it starts


def pytest_unconfigure(config):
    made = getattr(config, "_course_tmpdir", None)
    if made:
        path, before = made
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(_MADE)
        if before is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = before
