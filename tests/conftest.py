import pathlib
import sys
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _replayed_check_inputs(request):
    """Each test's exercise checks draw the same fresh inputs on every run (see
    helpers.checks._core.replay_seeds), so CI does not depend on a lucky draw."""
    from helpers.checks import _core
    _core.replay_seeds(zlib.crc32(request.node.nodeid.encode()))
    yield
    _core.replay_seeds(None)
