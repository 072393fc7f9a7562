"""Every byte counter writes one log (runtime/traffic.py's ByteLog of Transfer records): the
simulated devices' CommLog, a rank's comm, count_traffic's TrafficLog and DTensor's FuncolBytes
answer from the same records, each through the accessors its chapter uses."""
import torch

import helpers
from helpers.runtime.traffic import ByteLog, Transfer


def test_simulated_transfers_are_records():
    log = helpers.CommLog()
    devices = [torch.device("cpu")] * 3
    helpers.send(torch.ones(4), 0, 1, devices, log, "activation")
    helpers.send(torch.ones(2), 1, 2, devices, log, "gradient")
    helpers.send(torch.ones(8), 2, 2, devices, log, "kept")                # same device: free
    assert isinstance(log, ByteLog)
    assert log.records == [Transfer("activation", 0, 1, 16), Transfer("gradient", 1, 2, 8)]
    assert log.transfers == [(0, 1, 16, "activation"), (1, 2, 8, "gradient")]
    assert (log.total(), log.total("gradient"), log.sent_by(1)) == (24, 8, 8)


def test_a_ranks_messages_are_records_and_the_log_resets():
    def rank(r, world, cfg):
        comm = cfg["comm"]
        if r == 0:
            comm.send(torch.ones(3), 1)
        else:
            comm.recv(0, (3,))
        comm.all_reduce(torch.ones(5))
        before = (comm.log, comm.bytes_sent(), comm.calls("send"), comm.traffic.records)
        comm.reset_counts()
        return before, comm.log, comm.bytes_sent()

    (log0, sent0, sends0, recs0), after, sent_after = helpers.launch(rank, 2, threads=True)[0]
    assert log0 == [("send", 1, 12), ("all_reduce", None, 20)]
    assert recs0[0] == Transfer("send", 0, 1, 12) and (sent0, sends0) == (32, 1)
    assert after == [] and sent_after == 0


def test_collective_volumes_are_records_of_the_ring_volume():
    log = helpers.TrafficLog()
    log.add("all_reduce", 400, 4)
    log.add("all_gather_into_tensor", 400, 4)
    assert isinstance(log, ByteLog) and log.calls == {"all_reduce": 1, "all_gather_into_tensor": 1}
    assert log.bytes["all_reduce"] == helpers.ring_bytes_per_device(400, 4) == 600
    assert log.bytes["all_gather_into_tensor"] == 300 and log.sent_bytes == 900
    f = helpers.FuncolBytes()
    f.traffic.record("all_reduce_", 64)
    assert f.bytes_sent("all_reduce") == 64 and f.calls("all_reduce") == 1
    assert f.log == [("all_reduce_", None, 64)]


def test_all_to_all_counts_alike_on_threads_and_processes():
    """ThreadComm counts an all-to-all as DistComm does: one call, the bytes that left the rank
    (the rows for every other rank), so a chapter's counts do not depend on how ranks run."""
    from thread_ranks import run_threads

    def exchange(comm):
        x = torch.arange(12.0).reshape(6, 2)            # 6 rows of 8 bytes
        comm.all_to_all(x, [1, 2, 3], [comm.rank + 1] * 3)   # rank j gets j + 1 rows of each
        comm.all_to_all(x, [2, 2, 2], [2, 2, 2], op="counts")
        return comm.calls("all_to_all"), comm.bytes_sent("all_to_all"), comm.calls("counts")

    results, _ = run_threads(lambda comm: exchange(comm) if comm.world == 3 else None, 3)
    for rank, (calls, sent, counts) in enumerate(results):
        assert (calls, counts) == (1, 1)
        assert sent == 8 * (6 - [1, 2, 3][rank])        # every row but its own rows
