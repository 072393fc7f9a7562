import os
import pathlib
import sys
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores: N workers each
    running a pool of N threads on N cores wait out scheduler slices at every barrier."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def _replayed_check_inputs(request):
    """Each test's exercise checks draw the same fresh inputs on every run (see
    helpers.checks._core.replay_seeds), so CI does not depend on a lucky draw."""
    from helpers.checks import _core
    _core.replay_seeds(zlib.crc32(request.node.nodeid.encode()))
    yield
    _core.replay_seeds(None)
