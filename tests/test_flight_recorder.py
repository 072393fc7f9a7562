"""The flight-recorder reading of ddp_torchrun and the DataParallel/DDP timer of dataparallel."""
import pytest

from helpers import flight_recorder as fr


def _dump(seqs, pg_config=None):
    entries = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce",
                "process_group": ("0", "default_pg")} for s in seqs]
    return {"entries": entries, "pg_config": pg_config or {"0": {"name": "0"}}}


def test_first_unjoined_names_the_collective_one_rank_skipped():
    assert fr.first_unjoined({0: _dump([1, 2, 3, 4]), 1: _dump([1, 2, 3])}) == \
        (4, "gloo:all_reduce", {0})
    assert fr.first_unjoined({0: _dump([1, 2]), 1: _dump([1, 3])}) == (2, "gloo:all_reduce", {0})


def test_first_unjoined_is_none_when_every_rank_recorded_the_same():
    assert fr.first_unjoined({0: _dump([1, 2]), 1: _dump([1, 2])}) is None


def test_groups_are_renamed_only_where_the_dump_disagrees_with_its_entries():
    bad = _dump([1], {"": {"name": "", "desc": "", "ranks": "[0, 1]"}})
    fixed = fr._named_groups(bad)
    assert set(fixed["pg_config"]) == {"0"} and fixed["pg_config"]["0"]["ranks"] == "[0, 1]"
    good = _dump([1])
    assert fr._named_groups(good) is good


def test_the_recorder_is_turned_on_under_both_names(tmp_path):
    env = fr.fr_env(tmp_path)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] != "0"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(tmp_path))


def test_read_dumps_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="fr_env"):
        fr.read_dumps(tmp_path)


def test_time_dp_vs_ddp_refuses_fewer_than_two_gpus():
    import helpers
    if helpers.num_gpus() >= 2:
        pytest.skip("a machine with 2 GPUs runs it")
    with pytest.raises(RuntimeError, match="needs 2 GPUs"):
        helpers.time_dp_vs_ddp()


def test_this_torchs_recorder_keeps_2000_entries_by_default():
    """ddp_torchrun says the pinned torch keeps 2,000 entries with no variable set: the default
    its FlightRecorder reads TORCH_FR_BUFFER_SIZE with (the installed C++ header), the size
    fr_env also asks for."""
    import re
    from pathlib import Path

    import torch
    header = (Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" /
              "c10d" / "FlightRecorder.hpp")
    if not header.exists():
        pytest.skip("this torch ships no C++ headers")
    default = re.search(r'"TORCH_FR_BUFFER_SIZE",\s*"TORCH_NCCL_TRACE_BUFFER_SIZE"\},\s*(\d+)\)',
                        header.read_text())
    assert default, "FlightRecorder.hpp no longer reads TORCH_FR_BUFFER_SIZE as it did"
    assert int(default.group(1)) == fr.FR_ENTRIES == 2000
