"""The picture of a torchrun job (helpers.plot_torchrun) draws the environment its processes were
given: one box per rank with its RANK and LOCAL_RANK, the store at MASTER_ADDR:MASTER_PORT and who
serves it; torchrun_facts refuses environments that are not one machine's job."""
import subprocess
import sys

import matplotlib
import pytest

import helpers

matplotlib.use("Agg")


def _env(rank, world, port="29500", addr="localhost", agent="True"):
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT=port,
                TORCHELASTIC_USE_AGENT_STORE=agent)


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_facts_read_the_job_in_rank_order():
    facts = helpers.torchrun_facts([_env(1, 2), _env(0, 2)])
    assert facts == dict(world=2, addr="localhost", port=29500, agent_store=True,
                         ranks=[dict(rank=0, local_rank=0), dict(rank=1, local_rank=1)])
    assert not helpers.torchrun_facts([_env(0, 1, agent="False")])["agent_store"]


def test_facts_refuse_what_is_not_one_job():
    with pytest.raises(ValueError, match="no environments"):
        helpers.torchrun_facts([])
    with pytest.raises(ValueError, match="MASTER_PORT"):
        helpers.torchrun_facts([_env(0, 2), _env(1, 2, port="1")])
    with pytest.raises(ValueError, match="every rank once"):
        helpers.torchrun_facts([_env(0, 2), _env(0, 2)])
    with pytest.raises(ValueError, match="not set"):
        helpers.torchrun_facts([{k: v for k, v in _env(0, 1).items() if k != "RANK"}])
    two_machines = [dict(_env(r, 4), LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(r % 2))
                    for r in range(4)]
    with pytest.raises(ValueError, match="one machine"):
        helpers.torchrun_facts(two_machines)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_picture_draws_every_rank_and_the_store(world):
    import matplotlib.pyplot as plt
    texts = _texts(helpers.plot_torchrun(helpers.torchrun_facts(
        [_env(r, world, port="39693") for r in range(world)])))
    assert f"torchrun: starts {world} processes" in texts
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}" for r in range(world)]
    for r in range(world):
        assert any(t.startswith(f"RANK={r}\n") and t.endswith(f"RANK={r}") for t in texts)
    store = next(t for t in texts if t.startswith("TCPStore"))
    assert "localhost:39693" in store and "served by torchrun" in store
    assert any(f"WORLD_SIZE={world}" in t and "MASTER_PORT=39693" in t for t in texts)
    plt.close("all")


def test_the_picture_names_rank_0_as_the_server_without_the_agents_store():
    import matplotlib.pyplot as plt
    texts = _texts(helpers.plot_torchrun(helpers.torchrun_facts(
        [_env(r, 2, agent="False") for r in range(2)])))
    assert any("served by rank 0" in t for t in texts)
    with pytest.raises(ValueError, match="up to 4"):
        helpers.plot_torchrun(helpers.torchrun_facts([_env(r, 5) for r in range(5)]))
    plt.close("all")


def test_facts_read_a_real_torchrun_job():
    """What the chapter does: two processes print the variables torchrun gave them."""
    import json
    # one os.write per process, as the chapter does: print's two writes (the line, then its
    # newline) interleave between the processes when the output is unbuffered
    show = ("import json, os; os.write(1, (json.dumps({k: os.environ.get(k) for k in "
            f"{helpers.data_parallel.schematics.torchrun_schematics.LAUNCH_VARS!r}}}) + '\\n')"
            ".encode())")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "--no-python", sys.executable, "-c", show],
                         capture_output=True, text=True, timeout=120, check=True)
    envs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    facts = helpers.torchrun_facts(envs)
    assert facts["world"] == 2 and facts["agent_store"] and 0 < facts["port"] < 2**16
