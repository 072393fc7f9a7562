"""Every byte counter writes one log (runtime/traffic.py's ByteLog of Transfer records) and is
read one way, through ByteLog's methods: the simulated devices' log, a rank's comm,
count_traffic's TrafficLog and DTensor's FuncolBytes. Two sizes, one name each: `payload`
(the tensor handed over) and `wire` (what the rank puts on the network)."""
import pytest
import torch

import helpers
from helpers.runtime.traffic import ByteLog, TrafficLog, Transfer, wire_share


def test_simulated_transfers_are_records_read_by_one_api():
    log = ByteLog()
    devices = [torch.device("cpu")] * 3
    helpers.send(torch.ones(4), 0, 1, devices, log, "activation")
    helpers.send(torch.ones(2), 1, 2, devices, log, "gradient")
    helpers.send(torch.ones(8), 2, 2, devices, log, "kept")                # same device: free
    assert isinstance(log, ByteLog)
    assert log.records == [Transfer("activation", 0, 1, 16, 16, None, 4),
                           Transfer("gradient", 1, 2, 8, 8, None, 4)]
    assert (log.wire_bytes(), log.wire_bytes("gradient"), log.wire_bytes(src=1)) == (24, 8, 8)
    assert (log.wire_bytes(dst=1), log.wire_bytes(src=0, dst=2), log.payload_bytes()) == (16, 0, 24)
    assert (log.calls(), log.calls("kept"), len(log)) == (2, 0, 2)
    assert log.ops() == {"activation": 1, "gradient": 1}
    log.records.append("not recorded")                     # a copy
    assert log.calls() == 2


def test_mark_and_since_split_a_log():
    log = ByteLog()
    log.record("all_reduce", 10, wire=15)
    mark = log.mark()
    log.record("send", 4, 0, 1)
    log.record("all_reduce", 10, wire=15)
    later = log.since(mark)
    assert later.records == log.records[mark:] and later.ops() == {"send": 1, "all_reduce": 1}
    assert (later.wire_bytes(), later.payload_bytes(), log.wire_bytes()) == (19, 14, 34)


def test_wire_share_is_the_ring_share_of_each_collective():
    assert wire_share("all_reduce", 400, 4) == helpers.ring_bytes_per_device(400, 4) == 600
    assert wire_share("all_gather", 100, 4) == 300          # k - 1 shards of the input
    assert wire_share("reduce_scatter", 400, 4) == 300      # (k - 1) / k of the input
    assert wire_share("broadcast", 400, 4) == 300
    assert wire_share("all_reduce", 400, 1) == 0
    assert wire_share("send", 400, 4) == 400


def test_a_ranks_messages_and_collectives_have_both_sizes_and_the_log_resets():
    def rank(r, world, cfg):
        comm = cfg["comm"]
        if r == 0:
            comm.send(torch.ones(3), 1)
        else:
            comm.recv(0, (3,))
        comm.all_reduce(torch.ones(5))
        comm.all_gather(torch.ones(2))
        comm.reduce_scatter(torch.ones(4))
        before = comm.traffic.records
        comm.reset_counts()
        return before, comm.traffic.records

    recs, after = helpers.launch(rank, 2, threads=True)[0]
    assert recs == [Transfer("send", 0, 1, 12, 12, None, 4),
                    Transfer("all_reduce", 0, None, 20, 20.0, None, 4),
                    Transfer("all_gather", 0, None, 8, 8, None, 4),
                    Transfer("reduce_scatter", 0, None, 16, 8.0, None, 4)]
    assert after == []


def test_collective_volumes_are_records_of_the_ring_volume():
    log = TrafficLog()
    log.add("all_reduce", 400, 4)
    log.add("all_gather_into_tensor", 400, 4, ranks=[0, 2, 4, 6])
    assert isinstance(log, ByteLog) and log.ops() == {"all_reduce": 1, "all_gather_into_tensor": 1}
    assert log.wire_bytes("all_reduce") == 600 and log.payload_bytes("all_reduce") == 400
    assert log.wire_bytes("all_gather_into_tensor") == 300                 # 3 shards of 100
    assert log.payload_bytes("all_gather_into_tensor") == 100 and log.wire_bytes() == 900
    groups = log.by_group()
    assert set(groups) == {(), (0, 2, 4, 6)} and groups[(0, 2, 4, 6)].wire_bytes() == 300
    f = helpers.FuncolBytes()
    f.traffic.record("all_reduce_", 64)
    assert f.traffic.payload_bytes("all_reduce_") == 64 and f.traffic.calls("all_reduce") == 0


def test_all_to_all_counts_alike_on_threads_and_processes():
    """ThreadComm counts an all-to-all as DistComm does: one call, x as payload and the bytes that
    left the rank (the rows for every other rank) as wire, so a chapter's counts do not depend on
    how ranks run."""
    from thread_ranks import run_threads

    def exchange(comm):
        x = torch.arange(12.0).reshape(6, 2)            # 6 rows of 8 bytes
        comm.all_to_all(x, [1, 2, 3], [comm.rank + 1] * 3)   # rank j gets j + 1 rows of each
        comm.all_to_all(x, [2, 2, 2], [2, 2, 2], op="counts")
        t = comm.traffic
        return t.calls("all_to_all"), t.wire_bytes("all_to_all"), t.calls("counts"), \
            t.payload_bytes("all_to_all")

    results, _ = run_threads(lambda comm: exchange(comm) if comm.world == 3 else None, 3)
    for rank, (calls, sent, counts, payload) in enumerate(results):
        assert (calls, counts, payload) == (1, 1, 48)
        assert sent == 8 * (6 - [1, 2, 3][rank])        # every row but its own rows


@pytest.mark.parametrize("name", ["bytes_sent", "sent_bytes", "log", "transfers", "total",
                                  "sent_by", "bytes", "count"])
def test_no_second_reader_is_left(name):
    """One reading vocabulary: the old readers are gone from every log and comm."""
    from helpers.runtime.comm import ThreadComm
    for cls in (ByteLog, TrafficLog, helpers.FuncolBytes, ThreadComm):
        assert not hasattr(cls, name), f"{cls.__name__}.{name}"


def test_an_all_to_all_wire_is_the_rows_that_leave_the_rank_on_every_counter():
    """One meaning of wire for an all-to-all: the comms and DTensor's functional all-to-all
    (FuncolBytes) both count the rows that leave the rank; with no splits, equal ones."""
    from helpers.runtime.traffic import all_to_all_wire, wire_share
    x = torch.zeros(6, 2)                                   # 6 rows of 8 bytes
    assert all_to_all_wire(x, [1, 2, 3], 3, 1) == 8 * (6 - 2)
    assert all_to_all_wire(x, [], 3, 0) == all_to_all_wire(x, [2, 2, 2], 3, 0) == 32
    assert wire_share("all_to_all_single", 48, 3) == 32 and wire_share("all_to_all", 48, 1) == 0


def test_by_group_keys_on_a_collectives_group_never_on_a_messages_peer():
    """A message to rank 0 is a message, not a collective of no group: dst is only ever a peer,
    a collective's ranks are its group."""
    log = ByteLog()
    log.record("send", 8, 1, 0)                                 # a message to rank 0
    log.record("all_reduce", 40, 1, wire=60, group=(0, 1, 2, 3))
    log.record("all_reduce", 40, 1, wire=40, group=[1, 3])
    groups = log.by_group()
    assert set(groups) == {(), (0, 1, 2, 3), (1, 3)}
    assert groups[()].ops() == {"send": 1} and groups[()].payload_bytes(dst=0) == 8
    assert groups[(0, 1, 2, 3)].wire_bytes() == 60 and log.wire_bytes(dst=0) == 8


def test_until_and_since_split_a_log_at_a_mark():
    log = ByteLog()
    log.record("all_reduce", 10, wire=15)
    mark = log.mark()
    log.record("send", 4, 0, 1)
    assert log.until(mark).records == log.records[:mark] == [Transfer("all_reduce", None, None,
                                                                      10, 15)]
    assert log.until(mark).records + log.since(mark).records == log.records


def test_gathered_counts_an_all_gather_once_per_rank_and_numbers_count_elements():
    log = ByteLog()
    log.record("all_gather", 16, 0, wire=48, group=(0, 1, 2, 3), itemsize=4)   # 4 float32
    log.record("all_reduce", 16, 0, wire=24, group=(0, 1, 2, 3), itemsize=8)   # 2 float64
    assert (log.payload_bytes(), log.gathered_bytes(), log.gathered_bytes("all_reduce")) == \
        (32, 80, 16)
    assert (log.numbers(), log.numbers(gathered=True), log.numbers("all_gather")) == (6, 18, 4)


def test_tensor_bytes_is_the_one_size_of_a_tensor():
    from helpers.runtime.traffic import tensor_bytes
    assert tensor_bytes(torch.zeros(3, 2, dtype=torch.float64)) == 48
    log = ByteLog()
    helpers.send(torch.zeros(5, dtype=torch.int8), 0, 1, [torch.device("cpu")] * 2, log)
    assert log.payload_bytes() == 5


def test_count_traffic_refuses_a_thread_rank_and_serves_the_main_thread():
    """count_traffic rebinds torch.distributed for the whole process: thread ranks nesting it
    would restore each other's wrappers, so a rank of a ThreadWorld is refused."""
    import torch.distributed as dist

    from helpers.runtime.intercept import in_rank_thread
    from helpers.runtime.thread_world import ThreadWorld

    def rank(comm):
        with pytest.raises(RuntimeError, match=r"comm\.traffic \(a property\)") as refused, \
                helpers.count_traffic():
            pass
        assert "traffic()" not in str(refused.value)     # the advice, followed, must work
        assert comm.traffic is not None
        return in_rank_thread()
    assert ThreadWorld(2).run(rank) == [True, True]
    before = dist.all_reduce
    with helpers.count_traffic():
        assert dist.all_reduce is not before
    assert dist.all_reduce is before and not in_rank_thread()
