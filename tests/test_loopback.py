"""Ranks started on one machine (helpers.launch, scripts/ddp/spawn.py) meet at a
store whose server listens on 127.0.0.1 only; torch's own TCPStore server listens on every
interface, without authentication."""
import sys

import pytest
import reliability_ranks

import helpers

LOOPBACK = "0100007F"   # 127.0.0.1 as /proc/net/tcp writes it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_the_store_of_launched_ranks_listens_on_loopback_only():
    found = helpers.launch(reliability_ranks.listening, 2, timeout=120, quiet=True)[0]
    assert found, "no socket listens on MASTER_PORT"
    assert set(found) == {LOOPBACK}, f"listening on {found}: every interface, not 127.0.0.1"
