"""helpers.script_diff (helpers/paths.py): the torchrun chapter's diff from single.py to
torchrun.py shows what DDP needs, not the failure-injection demo of torchrun.py."""
import helpers
from helpers.paths import script_lines, script_path


def test_the_diff_shows_ddp_and_leaves_out_the_demo():
    diff = helpers.script_diff("single.py", "torchrun.py")
    assert diff.startswith("--- single.py\n+++ torchrun.py")
    added = [ln[1:] for ln in diff.splitlines()[2:] if ln.startswith("+")]
    assert any("DistributedDataParallel as DDP" in ln for ln in added)
    assert any("DistributedSampler(train_set, num_replicas=world_size" in ln for ln in added)
    assert not [ln for ln in added if "fail" in ln or "signal" in ln], "the demo leaked in"
    assert "@@" not in diff


def test_script_lines_drop_the_docstring_and_every_demo_line():
    text = script_path("torchrun.py").read_text()
    assert "fail_on_purpose" in text and "--fail-rank" in text   # the demo is there to drop
    kept = script_lines("torchrun.py")
    assert kept and not any("fail" in ln for ln in kept)
    assert text.split('"""')[1].strip().splitlines()[0] not in kept   # the docstring's first line
    # nothing else is dropped: every line of single.py without "fail" comes through
    single = script_path("single.py").read_text().split('"""\n', 1)[-1].splitlines()
    assert script_lines("single.py") == [ln for ln in single if "import signal" not in ln]
