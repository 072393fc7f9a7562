#!/usr/bin/env bash
# Run the course's GPU checks on a bare GPU machine whose Python has torch but no Jupyter packages
# and no package index (e.g. a lent H200 runner). Prepare on a machine with an index:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
#     -d .whl nbval ipykernel ipywidgets nbclient nbformat pyyaml
#   mkdir -p .seed && cp ../shared/data/FashionMNIST/raw/*.gz .seed/     # or let torchvision download
# then copy the repository (with .whl/ and .seed/) over and run:  bash scripts/gpu_runner.sh OUTDIR
set -uo pipefail
out=${1:-artifacts/gpu}; mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
if [ -d .seed ]; then mkdir -p data/FashionMNIST/raw && cp -n .seed/*.gz data/FashionMNIST/raw/; fi
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, '| GPUs:', torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$out/env.txt"
python3 -m pytest -q -x tests --ignore=tests/browser 2>&1 | tee "$out/unit.log" | tail -5
python3 -m pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider book 2>&1 | tee "$out/nbval.log" | tail -15
python3 scripts/bench.py --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
