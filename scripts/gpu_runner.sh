#!/usr/bin/env bash
# The course's GPU reference run, in one command, for a bare GPU machine whose Python has torch
# (the pinned 2.14 or 2.11) but no Jupyter packages and no package index (e.g. a lent H200).
#
#   bash scripts/gpu_runner.sh --prepare                 # FIRST, on a machine with an index:
#        Jupyter/test wheels for the GPU machine's Python into .whl/, Fashion-MNIST into .seed/
#   bash scripts/gpu_runner.sh [--steps S] [OUTDIR]      # on the GPU machine (repo root)
#   bash scripts/gpu_runner.sh --dry-run [OUTDIR]        # CI: every step, tiny, on a CPU, seconds
#
# Steps (--steps unit,nbval,bench,record is the default; each leaves its results in OUTDIR, so
# they can run in separate sessions, each under its own time limit):
#   unit    the unit tests (quick mode; the book-build and student-edition tests need the book
#           toolchain and are left out) -> unit.log, unit.xml
#   nbval   every notebook under nbval at FULL size (COURSE_FULL=1), one at a time, NB_TIMEOUT
#           seconds a cell (default 900), NOTEBOOKS to choose some (default book/**/*.ipynb)
#           -> nbval.log, nbval.json (each notebook's result, and those the budget left out;
#           a later session adds to it: copy the earlier OUTDIR's files into the new one first)
#   bench   scripts/bench.py at full size with the GPU targets (fast <= 0.15 s/epoch, >= 10x the
#           reference, 2 devices sharing one GPU <= 1.2x one) -> bench.log, bench.json; rows on
#           ranks with NCCL, one GPU each (BENCH_RANKS; default 1, or 1,2 with 2 GPUs)
#   record  gathers them, with env.json (GPU, versions, date, commit: captured by every step on
#           the GPU), into reference/gpu_reference.json and OUTDIR/gpu_reference.json; commit
#           that file. Steps that did not run are named there as not run.
# .whl/ and .seed/ are git-ignored: carry them over with the repository (about 50 MB).
# PYTHON (default python3) is the interpreter; PYVER (default 3.12) the GPU machine's Python
# for --prepare; COURSE_COMMIT names the commit where the copy has no .git; DEADLINE (seconds)
# is the budget of the whole call: a step stops, and notebooks are left out, when it runs out.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=run steps=unit,nbval,bench,record out=
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) mode=prepare ;;
    --dry-run) mode=dry ;;
    --steps) steps=${2:?--steps needs a list such as unit,bench}; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "gpu_runner.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  case "$s" in unit|nbval|bench|record) ;; *)
    echo "gpu_runner.sh: unknown step '$s': choose among unit,nbval,bench,record" >&2; exit 2 ;;
  esac
done
command="bash scripts/gpu_runner.sh $([ $mode = dry ] && echo --dry-run) --steps $steps"

if [ $mode = prepare ]; then
  set -e
  # the Jupyter and test stack the notebooks and tests need, pinned as in requirements/lock.txt,
  # for the GPU machine's Python (its torch stays), and torchvision for both torch lines (2.14,
  # 2.11). Only what the GPU machine lacks is kept in .whl/ (the carry is 64 MiB with the data):
  # GPU_HAS lists what it has (default: what the lent H200's image holds, per the device notes).
  all=$(mktemp -d)
  $PY -m pip download -q --only-binary=:all: --python-version "${PYVER:-3.12}" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$all" nbval==0.11.0 ipykernel==7.4.0 ipywidgets==8.1.9 \
    nbclient==0.11.0 nbformat==5.11.1 pytest==9.2.0 matplotlib==3.11.2 pyyaml==6.0.4
  for tv in 0.29.1 0.26.0; do
    $PY -m pip download -q --only-binary=:all: --python-version "${PYVER:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --no-deps -d "$all" \
      "torchvision==$tv" || echo "gpu_runner.sh: torchvision $tv not found (the GPU's own stays)"
  done
  has=${GPU_HAS:-"numpy pillow matplotlib contourpy cycler fonttools kiwisolver pyparsing
    python_dateutil six packaging pytest pluggy iniconfig pyyaml psutil pygments coverage attrs
    typing_extensions torchvision jinja2 markupsafe"}
  mkdir -p .whl
  for w in "$all"/*.whl; do
    name=$(basename "$w" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_')
    case " $(echo $has | tr 'A-Z-' 'a-z_') " in *" $name "*) ;; *) cp "$w" .whl/ ;; esac
  done
  rm -rf "$all"
  mkdir -p .seed && cp "${COURSE_DATA:-data}"/FashionMNIST/raw/*.gz .seed/
  du -sh .whl .seed
  echo "gpu_runner.sh: prepared; carry .whl and .seed with the repository to the GPU machine"
  exit 0
fi

out=${out:-artifacts/gpu$([ $mode = dry ] && echo -dry)}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
# wheels: install only the distributions this Python lacks (its own torch, numpy... stay first)
if [ -d .whl ]; then
  $PY - "${SITE:-/tmp/gpu-runner-site}" "$mode" <<'EOF' || exit 1
import glob, importlib.metadata as md, re, subprocess, sys
import torch
need = []
tv = {"2.14": "0.29", "2.11": "0.26"}.get(".".join(torch.__version__.split(".")[:2]))
for w in sorted(glob.glob(".whl/*.whl")):
    name = re.split(r"-\d", w.rsplit("/", 1)[-1], maxsplit=1)[0]
    if name == "torchvision" and f"-{tv}." not in w:
        continue   # the torchvision of the other torch line
    try:
        md.version(name)
    except md.PackageNotFoundError:
        need.append(w)
if sys.argv[2] == "dry":   # the wheels are for the GPU machine's Python: only say what it does
    print(f"gpu_runner: dry run: would install {len(need)} wheel(s) this Python lacks")
    sys.exit(0)
print(f"gpu_runner: installing {len(need)} wheel(s) this Python lacks into {sys.argv[1]}")
if need:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", sys.argv[1], *need], check=True)
EOF
fi
export PYTHONPATH=$PWD:${SITE:-/tmp/gpu-runner-site}${PYTHONPATH:+:$PYTHONPATH}
if [ -d .seed ]; then mkdir -p data/FashionMNIST/raw && cp -n .seed/*.gz data/FashionMNIST/raw/; fi
export COURSE_DATA=${COURSE_DATA:-$PWD/data} TQDM_DISABLE=1 PYTHONUNBUFFERED=1
unset COURSE_QUICK COURSE_FULL
dry=$([ $mode = dry ] && echo --dry-run)
$PY -c "from helpers.reference import main; main()" env "$out" $dry || exit 1
status=0
start=$(date +%s)
left() { echo $(( ${DEADLINE:-100000} - ($(date +%s) - start) )); }   # seconds of the budget

# the tests that need the book toolchain (jupyter-book, nbgrader, a browser) test no GPU code
book_tests="--ignore=tests/browser --ignore=tests/test_book.py --ignore=tests/test_student.py
  --ignore=tests/test_autograde.py --ignore=tests/test_build_scripts.py --ignore=tests/test_colab.py"
for s in ${steps//,/ }; do
  case "$s" in
  unit)
    if [ $mode = dry ]; then sel="tests/test_timing.py"; else sel="tests $book_tests"; fi
    par=$($PY -c "import xdist" 2>/dev/null && [ $mode != dry ] && echo "-n 8")  # 16 cores there
    # shellcheck disable=SC2086
    COURSE_QUICK=1 timeout "$(left)" $PY -m pytest -q -p no:cacheprovider $par $sel \
      --junitxml "$out/unit.xml" > "$out/unit.log" 2>&1 || status=1
    tail -3 "$out/unit.log" ;;
  nbval)
    tmp=$(mktemp -d)
    if [ $mode = dry ]; then   # the plumbing (kernel, PYTHONPATH, helpers): a two-cell notebook
      nbs="$tmp/dry.ipynb"
      $PY - "$nbs" <<'EOF' || exit 1
import sys
import nbformat as f
nb = f.v4.new_notebook()
nb.cells = [f.v4.new_code_cell("import helpers, torch"),
            f.v4.new_code_cell("print(helpers.describe_gpu_reference(), torch.__version__)")]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
f.write(nb, sys.argv[1])
EOF
      full=
    else
      nbs=${NOTEBOOKS:-$(find book -name '*.ipynb' -not -path '*/_build/*' | sort)}
      full=1
    fi
    # one notebook at a time while the budget (DEADLINE) lasts; each one's result goes into
    # nbval.json at once (a device returns 8 files: one summary, not a file per notebook)
    for nb in $nbs; do
      t0=$(date +%s)
      if [ "$(left)" -lt 120 ]; then
        $PY -c "from helpers.reference import main; main()" nbval "$out" "$nb" --not-run
        continue
      fi
      COURSE_FULL=$full timeout "$(left)" $PY -m pytest -q -p no:cacheprovider --nbval-lax \
        --nbval-current-env --nbval-cell-timeout "${NB_TIMEOUT:-900}" \
        --junitxml "$tmp/nb.xml" "$nb" >> "$out/nbval.log" 2>&1 || status=1
      $PY -c "from helpers.reference import main; main()" nbval "$out" "$nb" "$tmp/nb.xml" \
        "$(( $(date +%s) - t0 ))"
    done
    rm -rf "$tmp" ;;
  bench)
    if [ $mode = dry ]; then
      args="--quick --epochs 2 --subset 256 --rounds 1 --rows reference,fast,fast-shared
        --ranks 2 --check-steps 2 --targets gpu"
    else   # ranks: NCCL with one GPU each (2 ranks on one GPU would be gloo on the CPU)
      gpus=$($PY -c "import torch; print(torch.cuda.device_count())")
      args="--targets gpu --ranks ${BENCH_RANKS:-$([ "$gpus" -ge 2 ] && echo 1,2 || echo 1)}"
      export COURSE_FULL=1
    fi
    # shellcheck disable=SC2086
    timeout "$(left)" $PY scripts/bench.py $args --json "$out/bench.json" > "$out/bench.log" 2>&1 \
      || status=1
    grep -E "^(target|bench:)" "$out/bench.log" | tail -8
    unset COURSE_FULL ;;
  record)
    $PY -c "from helpers.reference import main; main()" record "$out" "$command" $dry \
      || status=1 ;;
  esac
done
[ $status -eq 0 ] || echo "gpu_runner.sh: a step failed: see the logs in $out"
exit $status
