#!/usr/bin/env bash
# The course's GPU reference run, for a bare GPU machine whose Python has torch but no Jupyter
# packages and no package index (e.g. a lent H200 runner). It runs the unit tests, every notebook
# under nbval at FULL size (COURSE_FULL=1), and the benchmark at full size, then rewrites the
# committed reference/gpu_reference.json (GPU, versions, date, command, figures) that Part IV's
# chapters show beside the reader's own. Commit that file afterwards.
#
# Prepare on a machine with an index (see ../shared/notes/toolchain.md), in the repository root:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
#     -d .whl nbval ipykernel ipywidgets nbclient nbformat pyyaml matplotlib
#   mkdir -p .seed && cp "$COURSE_DATA"/FashionMNIST/raw/*.gz .seed/   # or let torchvision fetch
# (.whl/ and .seed/ are ignored by git), copy the repository over, and run:
#   bash scripts/gpu_runner.sh [OUTDIR]          # logs and bench.json go to OUTDIR
set -uo pipefail
out=${1:-artifacts/gpu}; mkdir -p "$out"
command="bash scripts/gpu_runner.sh $*"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
if [ -d .seed ]; then mkdir -p data/FashionMNIST/raw && cp -n .seed/*.gz data/FashionMNIST/raw/; fi
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 COURSE_FULL=1
unset COURSE_QUICK
python3 - <<'EOF' | tee "$out/env.txt"
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "| GPUs:", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
if not torch.cuda.is_available():
    raise SystemExit("gpu_runner.sh: no GPU visible: this script records GPU runs only")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
status=0
python3 -m pytest -q tests --ignore=tests/browser -p no:cacheprovider > "$out/unit.log" 2>&1 || status=1
tail -5 "$out/unit.log"
python3 -m pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider book > "$out/nbval.log" 2>&1 || status=1
tail -15 "$out/nbval.log"
python3 scripts/bench.py --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_runner.sh: the benchmark failed"; exit 1; }
python3 - "$out" "$command" <<'EOF'
import sys
from helpers import write_gpu_reference
out, command = sys.argv[1], sys.argv[2]
tail = lambda name: open(f"{out}/{name}").read().splitlines()[-15:]
ref = write_gpu_reference(f"{out}/bench.json", command,
                          logs={"unit": tail("unit.log"), "nbval": tail("nbval.log")})
print("gpu_runner.sh: wrote reference/gpu_reference.json for", ref["gpu"], ref["date"])
EOF
exit $status
