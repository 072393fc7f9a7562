"""A right answer compiled by torch.compile passes on torch.compile's first use in the process:
dynamo's one-time installs (it wraps `nn.Module.__init__`, an import decorates networkx's
functions) are made before the check's snapshot (compile_ready.py), not charged to the answer.
Each case runs in a fresh interpreter, where the compile is the first."""
import os
import subprocess
import sys

import pytest

_ANSWER = """
import torch, helpers.checks as C
def global_mean_var(counts, means, variances):
    n = counts.sum()
    w = (counts / n)[:, None]
    mean = (w * means).sum(0)
    return mean, (w * (variances + (means - mean) ** 2)).sum(0)
if WHERE == "before":
    compiled = torch.compile(global_mean_var, backend=BACKEND)
    answer = lambda c, m, v: compiled(c, m, v)
else:
    def answer(c, m, v):
        return torch.compile(global_mean_var, backend=BACKEND)(c, m, v)
print(C.check_global_mean_var(answer).status)
"""


@pytest.mark.parametrize("where", ["before", "inside"])
def test_compiled_right_answer_passes_on_first_use(where):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    env.pop("COURSE_GRADING", None)
    env.pop("NBGRADER_EXECUTION", None)
    code = f"WHERE, BACKEND = {where!r}, 'eager'\n" + _ANSWER
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "passed", out.stdout[-2000:]
