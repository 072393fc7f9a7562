#!/usr/bin/env bash
# The course on a GPU: the code paths only a GPU runs, in steps that each fit one 10-minute
# command, riskiest first, for a bare GPU machine whose Python has torch (2.14 or 2.11) but no
# Jupyter packages and no package index (the lent H200: Python 3.12, torch 2.11, CUDA 13).
#
#   bash scripts/gpu_runner.sh --prepare               # FIRST, here (a package index): Jupyter
#        and test wheels for the GPU machine's Python into .whl/, Fashion-MNIST into .seed/
#   bash scripts/gpu_runner.sh [--steps S] OUTDIR      # on the GPU machine, from the repo root
#   bash scripts/gpu_runner.sh --dry-run [OUTDIR]      # CI (make gpu-dry): every step, tiny, CPU
#
# Steps (default: every one but unit and nbval, in this order; each appends its output to
# OUTDIR/runner.log and its result to OUTDIR/status.json, and a failure never stops the next):
#   sweep     every chapter launch target on one NCCL rank, cuda:0 (scripts/world1_sweep.py):
#             the NCCL path of the multi-rank chapters -> sweep.json
#   graphs    tests/test_fast.py -k cuda_graph: FastDataParallel's CUDA-graph capture
#   bench     scripts/bench.py, short: reference, fast (graphs, streams, compile), NCCL world 1
#             -> bench.json (the figures Part IV cites)
#   gpus      book/gpus.ipynb under nbval (quick): the cells only a GPU runs -> nbval.json;
#             and the figures its GPU-only sections quote where no GPU is (pinned and pageable
#             copies, the link, a step's memory, two streams, and the product timed without and
#             with synchronising: helpers.gpu_chapter_figures)                 -> paths.json
#   fixes     book/part4/fixes.ipynb under nbval (quick)                     -> nbval.json
#   train     one-GPU training in this process: helpers.train, helpers.train_fast -> paths.json
#   torchrun  scripts/ddp/torchrun.py on one GPU (NCCL, --snapshot, resumed), and 2 gloo ranks
#             on the CPU beside it                                           -> paths.json
#   comm      NCCL all_reduce times (world 1), a device-to-device copy's, and the rates the
#             emulated lessons model (fp32 matmul FLOP/s; messages: NCCL across 2 GPUs where
#             there are 2)                                                   -> paths.json
#   cp        torch's context_parallel at world 1 on cuda:0                  -> paths.json
#   memory    memory_per_stage at world 1: PeakBytes' count beside torch.cuda.max_memory_
#             allocated, for dp, zero1, zero2, zero3                         -> paths.json
#   record    gathers env.json (the machine, captured by every step), status.json and the
#             results into OUTDIR/gpu_reference.json and reference/gpu_reference.json (commit
#             it; steps that did not run are named there)
#   unit      (slow: ask for it) the unit tests, quick mode               -> unit.xml
#   nbval     (slow: ask for it) NOTEBOOKS (default every one) under nbval -> nbval.json
# The device returns at most 8 files from OUTDIR: the default steps write env.json, status.json,
# runner.log, sweep.json, bench.json, nbval.json, paths.json and gpu_reference.json. status.json
# names the first step that failed, with the end of its log (runner.log keeps all of it).
#
# DEADLINE (seconds, default 540) bounds the whole call: a step that would start with less than
# its estimate left is recorded as not run, and a running step is stopped at the deadline, so
# the runner, not the device, stops first. PYTHON (default python3) is the interpreter; PYVER
# (default 3.12) the GPU machine's Python for --prepare; COURSE_COMMIT names the commit where
# the copy has no .git; NOTEBOOKS chooses notebooks for the nbval step.
#
# The first GPU session (one H200, 15 minutes of device time in all, the machine's start
# included; 10 minutes at most a command). Here, first:
#   bash scripts/gpu_runner.sh --prepare        # .whl/ (12 MiB) and .seed/ (30 MiB), ignored
# Device call 1: run(command="DEADLINE=400 bash scripts/gpu_runner.sh $OUT",
#                    carry=[".whl", ".seed"], timeout_s=460)
#   (sweep, graphs, bench, gpus, fixes first; what the 400 s leave out is named "not run").
# Back here: mkdir -p artifacts/gpu-run && cp <files_at>/* artifacts/gpu-run/ ; read
# status.json (first_failure) and runner.log. If steps were not run and status() still shows
# budget_left_s above 300 (a machine gone back starts again in 1-2 minutes), device call 2:
#   run(command="mkdir -p $OUT && cp artifacts/gpu-run/*.json $OUT/ && DEADLINE=<budget_left_s
#       - 60> bash scripts/gpu_runner.sh --steps <those steps>,record $OUT",
#       carry=[".whl", ".seed", "artifacts/gpu-run"], timeout_s=<DEADLINE + 40>)
#   (each step adds to the files of call 1, so record gathers both); then give_back().
# Finally copy the last gpu_reference.json (it says "exists": true only from a GPU) to
# reference/ and commit it with a note of what failed; the fixes go into issues.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ALL=sweep,graphs,bench,gpus,fixes,train,torchrun,comm,cp,memory,record
mode=run steps=$ALL out=
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) mode=prepare ;;
    --dry-run) mode=dry ;;
    --steps) steps=${2:?--steps needs a list such as sweep,bench}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "gpu_runner.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  case ",$ALL,unit,nbval," in *",$s,"*) ;; *)
    echo "gpu_runner.sh: unknown step '$s': choose among $ALL,unit,nbval" >&2; exit 2 ;;
  esac
done
command="bash scripts/gpu_runner.sh $([ $mode = dry ] && echo --dry-run) --steps $steps"

if [ $mode = prepare ]; then
  set -e
  # the Jupyter and test stack the notebooks and tests need, pinned as in requirements/lock.txt,
  # for the GPU machine's Python (its torch stays). Only what the GPU machine lacks is kept in
  # .whl/ (the carry is 64 MiB with the data): GPU_HAS lists what it has (default: what the
  # lent H200's image holds, per the device notes; torchvision 0.26 for its torch 2.11 too).
  all=$(mktemp -d)
  $PY -m pip download -q --only-binary=:all: --python-version "${PYVER:-3.12}" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$all" nbval==0.11.0 ipykernel==7.4.0 ipywidgets==8.1.9 \
    nbclient==0.11.0 nbformat==5.11.1 pytest==9.2.0 matplotlib==3.11.2 pyyaml==6.0.4
  # (and what is not needed: debugpy, the kernel's debugger, 5 MB of the 64 MiB carry)
  has=${GPU_HAS:-"numpy pillow matplotlib contourpy cycler fonttools kiwisolver pyparsing
    python_dateutil six packaging pytest pluggy iniconfig pyyaml psutil pygments coverage attrs
    typing_extensions torchvision jinja2 markupsafe pytest_xdist execnet tqdm debugpy tzdata"}
  rm -rf .whl && mkdir -p .whl
  for w in "$all"/*.whl; do
    name=$(basename "$w" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_')
    case " $(echo $has | tr 'A-Z-' 'a-z_') " in *" $name "*) ;; *) cp "$w" .whl/ ;; esac
  done
  rm -rf "$all"
  mkdir -p .seed && cp "${COURSE_DATA:-data}"/FashionMNIST/raw/*.gz .seed/
  du -sh .whl .seed
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  carry=$(du -cb .whl .seed | tail -1 | cut -f1)
  echo "gpu_runner.sh: the repository ($((tree >> 20)) MiB) and the carry ($((carry >> 20)) MiB):"\
    "$(( (tree + carry) >> 20 )) MiB of the device's 64 MiB"
  [ $(( (tree + carry) >> 20 )) -lt 64 ] || { echo "gpu_runner.sh: over 64 MiB" >&2; exit 1; }
  echo "gpu_runner.sh: prepared; carry .whl and .seed with the repository to the GPU machine"
  exit 0
fi

out=${out:-$([ $mode = dry ] && echo _build/gpu-dry)}
[ -n "$out" ] || { echo "gpu_runner.sh: give the output folder (\$OUT on the device)" >&2; exit 2; }
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
log=$out/runner.log
# wheels: install only the distributions this Python lacks (its own torch, numpy... stay first)
if [ -d .whl ]; then
  $PY - "${SITE:-/tmp/gpu-runner-site}" "$mode" <<'EOF' >> "$log" 2>&1 || exit 1
import glob, importlib.metadata as md, re, subprocess, sys
need = []
for w in sorted(glob.glob(".whl/*.whl")):
    name = re.split(r"-\d", w.rsplit("/", 1)[-1], maxsplit=1)[0]
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
unset COURSE_FULL
export COURSE_QUICK=1                 # the paths, not the full sizes: those are for later runs
dry=$([ $mode = dry ] && echo --dry-run)
$PY -c "import helpers; helpers.gpu_runner_cli()" env "$out" $dry >> "$log" 2>&1 \
  || { tail -5 "$log"; exit 1; }
start=$(date +%s)
budget=${DEADLINE:-$([ $mode = dry ] && echo 1500 || echo 540)}   # a CPU in CI: slower, no device
left() { echo $(( budget - ($(date +%s) - start) )); }   # seconds of the budget
status=0

# status.json: each step's result, seconds and log lines; the first failure's log tail
note() {   # note STEP STATUS SECONDS FIRST_LINE
  $PY - "$out" "$@" <<'EOF'
import json, os, sys
out, step, status, seconds, first = sys.argv[1:6]
path = os.path.join(out, "status.json")
st = json.load(open(path)) if os.path.exists(path) else {"steps": {}}
st["steps"][step] = dict(status=status, seconds=int(seconds))
if status == "failed" and "first_failure" not in st:
    lines = open(os.path.join(out, "runner.log"), errors="replace").read().splitlines()
    st["first_failure"] = dict(step=step, log=lines[int(first):][-80:])
tmp = path + ".tmp"
json.dump(st, open(tmp, "w"), indent=1)
os.replace(tmp, path)
EOF
}

# python snippets of the path steps, run as a file (a rank started by helpers.launch imports
# its caller's main module, guarded): results go into paths.json under the step's name
paths() {   # paths STEP  (the code on stdin)
  { echo "def _step():"; sed 's/^/    /'; echo 'if __name__ == "__main__":'; echo '    _step()'
  } > "$tmp/$1.py"
  $PY "$tmp/$1.py" "$out" "$1" $dry
}

# estimates (seconds on the H200) below which a step is not started
declare -A need=([sweep]=60 [graphs]=40 [bench]=120 [gpus]=75 [fixes]=90 [train]=30
                 [torchrun]=60 [comm]=20 [cp]=15 [memory]=15 [record]=5 [unit]=300 [nbval]=120)
[ $mode = dry ] && for k in "${!need[@]}"; do need[$k]=1; done
tmp=$(mktemp -d)
for s in ${steps//,/ }; do
  if [ "$(left)" -lt "${need[$s]}" ]; then
    echo "gpu_runner: $s not run: $(left) s left of DEADLINE, it needs about ${need[$s]}" \
      | tee -a "$log"
    note "$s" "not run (budget)" 0 0
    continue
  fi
  first=$(wc -l < "$log")
  echo "==== $s ($(date -u +%H:%M:%S), $(left) s left)" >> "$log"
  t0=$(date +%s)
  ok=0
  case "$s" in
  sweep)
    backend=$([ $mode = dry ] && echo gloo || echo nccl)
    timeout "$(left)" $PY scripts/world1_sweep.py --backend "$backend" \
      --json "$out/sweep.json" --timeout "$(left)" >> "$log" 2>&1 || ok=1 ;;
  graphs)
    # (without nbval's plugin, which no test of it uses: 2 s of CPU to import)
    timeout "$(left)" $PY -m pytest -q -p no:cacheprovider -p no:nbval tests/test_fast.py \
      -k cuda_graph -rs >> "$log" 2>&1 || ok=1 ;;
  bench)
    if [ $mode = dry ]; then
      args="--quick --epochs 2 --subset 256 --rounds 1 --rows reference,fast,fast-shared,compile
        --ranks 1 --check-steps 2 --targets gpu"
    else   # ranks: NCCL with one GPU each (2 ranks on one GPU would be gloo on the CPU)
      args="--epochs 3 --subset 12800 --rounds 1 --targets gpu
        --rows reference,fast,fast-shared,fast-compile,compile,ddp --ranks 1"
    fi
    # shellcheck disable=SC2086
    COURSE_QUICK=$([ $mode = dry ] && echo 1) timeout "$(left)" $PY scripts/bench.py $args \
      --json "$out/bench.json" >> "$log" 2>&1 || ok=1 ;;
  gpus|fixes|nbval)
    case "$s" in
      gpus) nbs=book/gpus.ipynb ;;
      fixes) nbs=book/part4/fixes.ipynb ;;
      *) nbs=${NOTEBOOKS:-$(find book -name '*.ipynb' -not -path '*/_build/*' | sort)} ;;
    esac
    collect=
    if [ $mode = dry ]; then   # the chapters collected, and the plumbing (kernel, PYTHONPATH,
      # helpers) run once, on a two-cell notebook: gpus, in the pytest that runs it (the chapter
      # collected, its cells deselected: a collection error fails it); the others collected only
      if [ $s = gpus ]; then
        collect="$nbs --deselect $nbs"
        nbs="$tmp/dry.ipynb"
        $PY - "$nbs" <<'EOF' || ok=1
import sys
import nbformat as f
nb = f.v4.new_notebook()
nb.cells = [f.v4.new_code_cell("import helpers, torch"),
            f.v4.new_code_cell("print(helpers.describe_gpu_reference(), torch.__version__)")]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
f.write(nb, sys.argv[1])
EOF
      else
        # shellcheck disable=SC2086
        timeout "$(left)" $PY -m pytest -q -p no:cacheprovider --nbval-lax --collect-only $nbs \
          >> "$log" 2>&1 || ok=1
        nbs=
      fi
    fi
    for nb in $nbs; do
      if [ "$(left)" -lt 30 ]; then
        $PY -c "import helpers; helpers.gpu_runner_cli()" nbval "$out" "$nb" --not-run \
          >> "$log" 2>&1
        continue
      fi
      t1=$(date +%s)
      # shellcheck disable=SC2086
      timeout "$(left)" $PY -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env \
        --nbval-cell-timeout "$(( $(left) < 300 ? $(left) : 300 ))" --junitxml "$tmp/nb.xml" \
        $collect "$nb" >> "$log" 2>&1 || ok=1
      $PY -c "import helpers; helpers.gpu_runner_cli()" nbval "$out" "$nb" "$tmp/nb.xml" \
        "$(( $(date +%s) - t1 ))" >> "$log" 2>&1
      rm -f "$tmp/nb.xml"
    done
    if [ $s = gpus ]; then   # what the chapter quotes from this run where no GPU is
      paths gpus >> "$log" 2>&1 <<'EOF' || ok=1
import sys
import torch
import helpers
if helpers.num_gpus() > 0:
    res = helpers.gpu_chapter_figures()   # the timer's products at the chapter's size (GPU_TIMER_WORK)
else:   # a dry run's CPU: the timer's code on a small product; the chapter quotes none of it
    res = dict(helpers.unsynced_timings(torch.device("cpu"), dict(n=64, reps=2, rounds=2)),
               device="cpu")
helpers.add_gpu_path(sys.argv[1], sys.argv[2], res)
print(res)
EOF
    fi ;;
  train)
    paths train >> "$log" 2>&1 <<'EOF' || ok=1
import sys
import helpers
dry = "--dry-run" in sys.argv
size = dict(num_epochs=1, subset=512) if dry else dict(num_epochs=2, subset=12800)
naive = helpers.train(2, 256, 0.2, plot=False, **size)   # Part II: two replicas, one GPU
fast = helpers.train_fast(2, 256, 0.2, replica_streams=helpers.num_gpus() > 0, verbose=True,
                          **size)
keep = ("num_gpus", "test_acc", "sec_per_epoch", "epoch_times")   # a renamed key: KeyError
got = dict(train={k: naive[k] for k in keep}, train_fast={k: fast[k] for k in keep},
           devices=[str(d) for d in helpers.get_devices(2)])
if helpers.num_gpus() >= 2:     # Part III: DataParallel against DDP, a step each (2 GPUs)
    dd = helpers.time_dp_vs_ddp(batch=256, steps=50, rounds=3)
    got["dp_vs_ddp"] = dict(dp=dd.dp.to_dict(), ddp=dd.ddp.to_dict(), ratio=dd.ratio.to_dict(),
                            batch=dd.batch, steps=dd.steps)
helpers.add_gpu_path(sys.argv[1], sys.argv[2], got)
EOF
    ;;
  torchrun)
    paths torchrun >> "$log" 2>&1 <<'EOF' || ok=1
import json, os, subprocess, sys, tempfile
import helpers
dry = "--dry-run" in sys.argv
run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
size = ["--dry-run"] if dry else ["--subset", "2048", "--epochs", "2"]
got = {}
with tempfile.TemporaryDirectory() as tmp:
    run += ["--log-dir", os.path.join(tmp, "logs")]   # torchrun's, else a new one in /tmp
    for name, extra in (("nccl_1", ["--nproc-per-node", "1"]),
                        ("resumed_1", ["--nproc-per-node", "1"]),
                        ("gloo_2", ["--nproc-per-node", "2"]))[:1 if dry else 3]:
        args = [*run, *extra, "scripts/ddp/torchrun.py", *size,
                "--metrics", os.path.join(tmp, name + ".json")]
        if name != "gloo_2":    # the second run resumes from the first's snapshot
            args += ["--snapshot", os.path.join(tmp, "snap.pt")]
        else:
            args += ["--backend", "gloo"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        print(r.stdout[-3000:], r.stderr[-3000:])
        got[name] = dict(returncode=r.returncode)
        if r.returncode == 0:   # the metrics torchrun.py wrote: a renamed key is a KeyError
            m = json.load(open(os.path.join(tmp, name + ".json")))
            got[name].update(backend=m["backend"], device=m["device"], test_acc=m["test_acc"],
                             epochs=len(m["history"]))
    # ddp_torchrun's flight recorder on NCCL (a GPU per rank: 2 GPUs); the dry run, on gloo
    import torch
    from helpers import flight_recorder as fr
    if torch.cuda.device_count() >= 2 or dry:
        d = os.path.join(tmp, "fr")
        os.makedirs(d)
        r = subprocess.run([*run, "--nproc-per-node", "2", "-m", "helpers.flight_recorder",
                            d, "--timeout", "4"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, **fr.fr_env(d)})
        dumps = fr.read_dumps(d) if any(n.startswith("rank_") for n in os.listdir(d)) else {}
        unjoined = fr.first_unjoined(dumps) if dumps else None
        got["flight_recorder"] = dict(
            backend="nccl" if torch.cuda.device_count() >= 2 else "gloo",
            entries={str(k): len(v["entries"]) for k, v in dumps.items()},
            first_unjoined=unjoined and [unjoined[0], unjoined[1], sorted(unjoined[2])],
            analyzer=fr.fr_trace_report(d).splitlines()[:12] if dumps else [],
            returncode=0 if dumps else r.returncode)
    else:
        got["flight_recorder"] = dict(skipped="NCCL needs a GPU per rank: 2 GPUs")
helpers.add_gpu_path(sys.argv[1], sys.argv[2], got)
assert all(v.get("returncode", 0) == 0 for v in got.values()), got
EOF
    ;;
  comm)
    paths comm >> "$log" 2>&1 <<'EOF' || ok=1
import sys
import torch
import helpers
dry = "--dry-run" in sys.argv
gpu = helpers.num_gpus() > 0
backend = "nccl" if gpu else "gloo"
sizes = [1024, 1 << 16] if dry else [1024, 1 << 20, 1 << 24]
allreduce = helpers.time_gloo_allreduce(sizes, world_size=1, reps=3, backend=backend,
                                        quiet=True)
res = dict(backend=backend, allreduce_world1_s={str(k): v for k, v in allreduce.items()})
if gpu:
    helpers.exact_float32()       # the course's float32 (no TF32): what its runs compute in
    d = torch.device("cuda", 0)
    n = 4096
    a, b = torch.randn(n, n, device=d), torch.randn(n, n, device=d)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    end.synchronize()
    flops = 10 * 2 * n ** 3 / (start.elapsed_time(end) / 1e3)
    copies = {}
    for k in (1 << 10, 1 << 28):  # bytes: latency, then bandwidth, of one on-GPU copy
        src = torch.empty(k, dtype=torch.uint8, device=d)
        dst = torch.empty_like(src)
        dst.copy_(src)
        rounds = []
        for _ in range(5):        # the median of 5 rounds of 10 copies each
            start.record()
            for _ in range(10):
                dst.copy_(src)
            end.record()
            end.synchronize()
            rounds.append(start.elapsed_time(end) / 1e3 / 10)
        copies[k] = sorted(rounds)[2]
    x = torch.randn(16, 16, device=d)
    x @ x
    rounds = []
    for _ in range(5):            # a tiny product's call: 5 rounds of 10 back to back
        start.record()
        for _ in range(10):
            x @ x
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / 1e3 / 10)
    res.update(matmul_fp32_flops_per_s=flops, copy_s={str(k): v for k, v in copies.items()},
               copy_rounds=5, matmul_tiny_s=sorted(rounds)[2])
    rates = dict(flops_per_s=flops, measured=["flops_per_s"])
    if helpers.num_gpus() >= 2:   # messages: NCCL between two GPUs
        two = helpers.time_gloo_allreduce([1, 1 << 26], world_size=2, reps=5,
                                          backend="nccl", quiet=True)
        beta = (1 << 26) * 4 / max(two[1 << 26] - two[1], 1e-9)
        rates.update(alpha=two[1], beta=beta, measured=["flops_per_s", "alpha", "beta"])
    res["rates"] = rates
helpers.add_gpu_path(sys.argv[1], sys.argv[2], res)
print(res)
EOF
    ;;
  cp)
    paths cp >> "$log" 2>&1 <<'EOF' || ok=1
import dataclasses
import sys
import helpers
backend = "nccl" if helpers.num_gpus() > 0 else "gloo"
got = helpers.launch(helpers.cp_torch_run, 1, dict(width=16, heads=2, batch=1, T=64),
                     backend=backend, quiet=True)[0]
helpers.add_gpu_path(sys.argv[1], sys.argv[2], dict(dataclasses.asdict(got), backend=backend))
print(got)
EOF
    ;;
  memory)
    paths memory >> "$log" 2>&1 <<'EOF' || ok=1
import sys
import helpers
backend = "nccl" if helpers.num_gpus() > 0 else "gloo"
sizes = dict(width=64, depth=2) if "--dry-run" in sys.argv else dict(width=1024, depth=8)
got = helpers.run_ranks(1, [("memory", helpers.memory_per_stage, dict(sizes=sizes))],
                        backend=backend)[0]["memory"]
rows = {stage: {k: getattr(m, k) for k in ("n_params", "params_bytes", "optim_bytes",
                                           "transient_peak", "peak_bytes", "cuda_peak")}
        for stage, m in got.items()}   # StageMemory (helpers/sharding/results.py)
helpers.add_gpu_path(sys.argv[1], sys.argv[2], dict(backend=backend, sizes=sizes, stages=rows))
for stage, r in rows.items():
    print(stage, r)
EOF
    ;;
  unit)
    sel=$([ $mode = dry ] && echo tests/test_timing.py || echo tests)
    book="--ignore=tests/browser --ignore=tests/test_book.py --ignore=tests/test_student.py
      --ignore=tests/test_exercise_conventions.py --ignore=tests/test_teachers_guide.py
      --ignore=tests/test_autograde.py --ignore=tests/test_build_scripts.py
      --ignore=tests/test_colab.py --ignore=tests/test_colab_setup_cell.py
      --ignore=tests/test_plain_install.py"
    par=$($PY -c "import xdist" 2>/dev/null && [ $mode != dry ] && echo "-n 8")  # 16 cores there
    # shellcheck disable=SC2086
    timeout "$(left)" $PY -m pytest -q -p no:cacheprovider $par $sel $book \
      --junitxml "$out/unit.xml" >> "$log" 2>&1 || ok=1 ;;
  record)
    $PY -c "import helpers; helpers.gpu_runner_cli()" record "$out" "$command" $dry \
      >> "$log" 2>&1 || ok=1 ;;
  esac
  secs=$(( $(date +%s) - t0 ))
  if [ $ok -eq 0 ]; then
    echo "gpu_runner: $s passed ($secs s)" | tee -a "$log"
    note "$s" passed "$secs" "$first"
  else
    status=1
    echo "gpu_runner: $s FAILED ($secs s): the end of its log:" | tee -a "$log"
    tail -n +"$((first + 1))" "$log" | tail -25
    note "$s" failed "$secs" "$first"
  fi
done
rm -rf "$tmp"
[ $status -eq 0 ] || echo "gpu_runner.sh: a step failed: see $out/status.json and runner.log"
exit $status
