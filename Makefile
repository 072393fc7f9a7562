# Two commands do all the set-up on a fresh machine (see README):
#   make book   build the HTML book into _build/html (creates .venv on first use)
#   make test   run every test: lint, unit tests, notebooks under nbval, the book build, the browser
#               test, the whole-book PDF, the Colab emulation, the student edition
# TORCH=cpu (CPU CI): the venv gets torch's CPU wheels instead of the CUDA build of the lock.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements/lock.txt
JB     := $(BIN)/jupyter-book build . --all -W -n --keep-going
export TQDM_DISABLE := 1
export PYTHONUNBUFFERED := 1
# Bytecode cached (__pycache__, ignored by git) for every target, even where the environment
# turns it off: uv installs no bytecode, and every kernel, rank and script would otherwise compile
# what it imports again (helpers' modules and torch's, seconds of CPU each, hundreds of processes
# in a test run or a book build).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: book test lint test-unit test-notebooks test-py test-beside test-book test-book-fresh \
	test-browser student test-student bench \
	gpu-dry outputs lock venv clean book-static pdf pdf-html test-pdf test-pdf-html chromium
TORCH ?=
CPU_INDEX := https://download.pytorch.org/whl/cpu
# With TORCH=cpu: which CPU wheels (default: the lock's versions; CI's oldest-torch job names older)
TORCH_PINS ?= $(shell $(PYTHON) scripts/lock_subset.py --torch-pins $(LOCK))

# uv installs the venvs (requirements/uv.txt, pinned with its hashes, in a venv of its own under
# _build/): it downloads and unpacks wheels in parallel and leaves bytecode to the first import,
# where pip took one core for minutes over the lock's CUDA build of torch. It reads no pip.conf.
# Order-only for the venvs: a new copy of uv (after `make clean`) reinstalls nothing.
UV_VENV := _build/uv
UV := $(UV_VENV)/bin/uv
UV_INSTALL = $(UV) pip install --quiet --python
$(UV): requirements/uv.txt
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install --quiet --require-hashes -r requirements/uv.txt

# The venv from the lock file: every package pinned with its hash (requirements/lock.txt).
# A venv outside this tree (VENV=/elsewhere/.venv, shared by several git worktrees) is used as it
# is: reinstalling it from here would point its editable `helpers` at this tree.
ifneq ($(filter $(CURDIR)/%,$(abspath $(VENV))),)
$(STAMP): $(LOCK) pyproject.toml | $(UV)
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11 or newer is needed (numpy 2.4)" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
# TORCH=cpu: the CPU wheels of torch and torchvision from the PyTorch index (not hashed: the
# lock holds PyPI's CUDA build), then the lock without them and what only that build needs.
ifeq ($(TORCH),cpu)
	$(UV_INSTALL) $(BIN)/python --index-url $(CPU_INDEX) $(TORCH_PINS)
	$(PYTHON) scripts/lock_subset.py --cpu $(LOCK) -o $(VENV)/lock-cpu.txt
	$(UV_INSTALL) $(BIN)/python --require-hashes -r $(VENV)/lock-cpu.txt
else
	$(UV_INSTALL) $(BIN)/python --require-hashes -r $(LOCK)
endif
	$(UV_INSTALL) $(BIN)/python --no-deps -e .
# uv writes no bytecode: one process compiles what every kernel, rank and test imports, once,
# before make test starts them in parallel (each would compile the same modules itself)
	$(BIN)/python -c 'import helpers.checks, torchvision, matplotlib.pyplot, nbformat, ipykernel'
	touch $@
else
$(STAMP):
	@test -x $(BIN)/python || (echo "no venv at $(VENV)"; exit 1)
endif

venv: $(STAMP)

# Re-resolve requirements.txt (the groups under requirements/) into the lock, with hashes, using
# uv from a throwaway venv under _build/ (never the course's venv).
lock: $(UV)
	$(UV) pip compile requirements.txt --generate-hashes --universal --python-version 3.11 \
		--no-header --quiet -o _build/lock.txt
	(sed -n '1,3p' $(LOCK); cat _build/lock.txt) > _build/lock.new && mv _build/lock.new $(LOCK)

# EXECUTE=off builds from the outputs stored in the notebooks (the hosted Pages build).
EXECUTE ?= force
book: $(STAMP)
ifeq ($(EXECUTE),force)
	$(JB)
else
	$(BIN)/python scripts/book_config.py --execute $(EXECUTE) --out _build/_config.book.yml
	$(JB) --config _build/_config.book.yml
endif
	@echo "The book is in _build/html/ (open _build/html/index.html)"

# The hosted Pages build: the book from the stored outputs, in a venv of the book's tools only
# (requirements/book.txt's packages from the lock, with their hashes: no torch, about 270 MB).
BOOK_VENV ?= .venv-book
$(BOOK_VENV)/.installed: $(LOCK) requirements/book.txt | $(UV)
	$(PYTHON) -m venv $(BOOK_VENV)
	$(PYTHON) scripts/lock_subset.py --only requirements/book.txt $(LOCK) -o $(BOOK_VENV)/lock-book.txt
	$(UV_INSTALL) $(BOOK_VENV)/bin/python --require-hashes -r $(BOOK_VENV)/lock-book.txt
	touch $@

book-static: $(BOOK_VENV)/.installed
	$(BOOK_VENV)/bin/python scripts/book_config.py --execute off --out _build/_config.book.yml
	$(BOOK_VENV)/bin/jupyter-book build . --all -W -n --keep-going --config _build/_config.book.yml
	@echo "The book is in _build/html/ (open _build/html/index.html)"

# The whole book as one PDF (_build/pdf/book.pdf): Sphinx's single-page HTML from the stored
# outputs (pdf-html, in PDF_VENV: any venv with the book's tools, the Pages one in CI), printed
# by the Chromium the browser test drives (scripts/book_pdf.py).
PDF_VENV ?= $(VENV)
pdf-html: $(PDF_VENV)/.installed
	$(PDF_VENV)/bin/python scripts/book_config.py --execute off --out _build/_config.pdf.yml
	$(PDF_VENV)/bin/jupyter-book build . --builder singlehtml -W -n --keep-going \
		--config _build/_config.pdf.yml

pdf: $(STAMP) pdf-html
	$(BIN)/python scripts/book_pdf.py

# The tests on every core (pytest-xdist): a test module, or a notebook's cells, on one worker, in
# order. JOBS=0 runs them in this process (a debugger, print statements). More workers than
# cores: 3 on 2 cores took the unit tests from 272-308 s to 242 s, but starved a schedule test
# once, and 4 made the notebooks slower. ORDERED (where tests/ is collected): modules and
# notebooks start in the order tests/conftest.py gives them, the longest first (xdist's default
# orders them by their number of tests, which can start a 7-minute notebook last).
JOBS   ?= auto
XDIST  := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadscope)
ORDERED := $(if $(XDIST),--no-loadscope-reorder)

# Everything CI runs, in quick mode (COURSE_QUICK=1): minutes on 2 CPU cores. While the course
# venv installs (uv, mostly waiting on downloads), the other core builds the Pages book (its own
# venv, no torch, then one Sphinx process), node_modules and the PDF's single page (in the Pages
# venv, after the book: they share _build/.doctrees). Then one pytest run (test-py) shares out
# the unit tests and the notebooks under nbval over its workers, longest first, so that no last
# long module leaves a core idle. make's second job slot runs the other stages beside it: gpu-dry
# (one small step after another), the PDF's printing, then test-beside, the browser test and the
# test modules that mostly wait, on two workers of their own; then the fresh book's Sphinx build
# after test-py. Measured on a quiet fresh clone (2026-12-07, 2 cores): with the browser test
# inside test-py the second slot had nothing left to run for the last 8 minutes, while test-py's
# workers kept 1.67 cores busy (the browser and the chapters' launches wait). Order-only
# prerequisites set the order (`make test-book` alone still runs only the book); make starts
# runnable stages in the order of TEST_STAGES. No --output-sync: it would hold a stage's output
# until the stage ends (minutes of silence).
TEST_STAGES := test-py lint test-book test-pdf-html gpu-dry test-pdf test-beside test-book-fresh
test: export COURSE_QUICK := 1
# One torch thread per process: the two pytest workers' notebook kernels and test processes share
# 2 cores, and each one's default pool of 2 threads spun at every parallel region (syncbn's quick
# run: 27 s of CPU and 164 s on a loaded machine with the default, 10 s and 69 s with one thread).
# The course's own launches already give each rank one thread (helpers.runtime.launch).
test: export OMP_NUM_THREADS := 1
# A claim the run contradicts fails the test (helpers.prose.claim); a reader's run only says so.
test: export COURSE_CLAIMS := strict
test-notebooks: export COURSE_CLAIMS := strict
test-py: export COURSE_CLAIMS := strict
# cpu_use.py (stdlib only, so the system Python runs it before the venv exists) prints the CPU
# every process of the run, and of test-py, used beside the wall time:
# near 2 cores busy, only cheaper tests shorten a stage; well below, it waits, and more workers
# (JOBS=3) or a better order would help.
cpu_use = $(if $(filter 1,$(CI_ORDER)),$(PYTHON) scripts/cpu_use.py $(1))
# test-py's workers: as many as the cores (JOBS=auto). Measured on quiet fresh clones of a 2-core
# machine, one run each: two workers kept 1.58 cores busy (test-py 847 s, 1,341 s of CPU), three
# 1.77 (844 s, 1,496 s): the same wall for more CPU, so two.
test:
	@$(PYTHON) scripts/cpu_use.py "make test" $(MAKE) --no-print-directory -j2 CI_ORDER=1 \
		$(STAMP) test-book node_modules/.installed $(TEST_STAGES)

ifeq ($(CI_ORDER),1)
test-py: | test-book
# last in the second slot: started earlier, it took the slot test-py was waiting for (chromium's
# check ran first) and test-py started after gpu-dry and the PDF, 2 minutes late
test-beside: | test-pdf gpu-dry
endif

# ruff: Python files at 100 columns, notebooks at 79 (book/ruff.toml); config in pyproject.toml.
# The workflows: GitHub's schema (check-jsonschema, offline: its bundled copy) and zizmor's
# security audit (offline: no GitHub API).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/zizmor --offline .github/workflows

# Unit tests, the book's consistency tests and the Colab emulation (tests/test_colab.py).
test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider $(XDIST) $(ORDERED) tests --ignore=tests/browser

# Also keeps each notebook as this run left it (book/conftest.py), for test-book-fresh.
NBVAL := --nbval-lax --nbval-current-env --executed-into _build/executed
test-notebooks: $(STAMP)
	rm -rf _build/executed
	$(BIN)/pytest -q $(NBVAL) -p no:cacheprovider $(XDIST) book

# test-unit and test-notebooks in one run: the workers share out all. The 30 longest tests and
# notebooks are listed at the end (where CI time goes), and the test modules and notebooks that
# cost most CPU, with how long each worker sat idle at the end (all of them, with their worker,
# start and end, in _build/scope-times.json: conftest.py's --scope-times). Under `make test` it
# leaves out what test-beside runs.
test-py: $(STAMP)
	rm -rf _build/executed
	$(call cpu_use,test-py) $(BIN)/pytest -q --durations=30 --scope-times _build/scope-times.json \
		$(NBVAL) -p no:cacheprovider $(XDIST) $(ORDERED) tests book \
		$(addprefix --ignore=,$(if $(filter 1,$(CI_ORDER)),$(BESIDE),tests/browser))

# Beside test-py under `make test`, in make's second job slot on two workers of their own: the
# browser test (tests/browser: Chromium, offline; it needs the Pages book, node_modules and
# Chromium) and the test modules that mostly wait (WAITING: the simulated GPUs' sleeps, launch
# timeouts; each in one process on a 2-core machine, 2026-12-07, wall against CPU:
# test_checks_time_it.py 104 s against 11 s, test_launch.py 57 against 20,
# test_checks_time_it_events.py 16 against 1). Without nbval's plugin, which none of them uses:
# it imports nbformat, whose jsonschema builds rfc3987-syntax's 35 grammars (2 s of CPU in each
# process). Alone, `make test-py` runs the waiting modules with the rest.
WAITING := tests/test_checks_time_it.py tests/test_checks_time_it_events.py \
	tests/test_checks_time_it_clocks.py tests/test_checks_time_it_streams.py tests/test_launch.py
BESIDE := tests/browser $(WAITING)
test-beside: $(STAMP) test-book node_modules/.installed chromium
	$(call cpu_use,test-beside) $(BIN)/pytest -q -p no:cacheprovider -p no:nbval \
		$(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadscope) $(ORDERED) $(BESIDE)

# The book as the Pages workflow builds it (.github/workflows/pages.yml runs `make book-static`):
# from the stored outputs, in the book's own venv (no torch), with warnings as errors. On CI's
# fresh clone that venv is created from the lock, as on a hosted Pages runner.
test-book: $(BOOK_VENV)/.installed
	rm -rf _build/html _build/.doctrees
	$(MAKE) --no-print-directory book-static

# The book from this run's outputs (test-notebooks kept them): what `make book`, which executes
# every chapter, would render. Catches an output that breaks the build only when run afresh
# (quick mode here) without executing the chapters a second time.
test-book-fresh: $(STAMP) $(if $(filter 1,$(CI_ORDER)),test-py,test-notebooks)
	$(BIN)/python scripts/fresh_book.py --executed _build/executed --out _build/fresh
	$(BIN)/jupyter-book build _build/fresh --all -W -n --keep-going

# The browser test alone (`make test` runs it in test-beside).
# Every page of _build/html (built by test-book) in headless Debian Chromium, offline, with
# axe-core (node_modules/, from package-lock.json) in light and dark mode; screenshots in
# artifacts/screenshots/. Without nbval's plugin, which no browser test uses: it imports
# nbformat, whose jsonschema builds rfc3987-syntax's 35 grammars (2 s of CPU in each process).
test-browser: $(STAMP) test-book node_modules/.installed chromium
	$(call cpu_use,test-browser) $(BIN)/pytest -q -p no:cacheprovider -p no:nbval \
		$(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist load) tests/browser

# Debian's chromium (the browser test's and the PDF's), installed when missing and run as root
# (Playwright's own browser download fails here; see tests/browser/conftest.py).
chromium:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq chromium)

# The PDF in CI: its single page built by the Pages venv (after the Pages book: one Sphinx
# build at a time in _build/), then printed (about 30 s of CPU).
test-pdf-html: $(BOOK_VENV)/.installed test-book
	$(MAKE) --no-print-directory pdf-html PDF_VENV=$(BOOK_VENV)

test-pdf: $(STAMP) chromium test-pdf-html
	$(BIN)/python scripts/book_pdf.py

# The pinned JavaScript (axe-core for the browser test), with integrity hashes from the lock.
node_modules/.installed: package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $@

# The student edition (book/teachers.md): solutions replaced by stubs, outputs cleared, checks kept;
# nbgrader's generate_assignment does it. Also an nbgrader course folder (gradebook) in _build/nbgrader.
student: $(STAMP)
	$(BIN)/python scripts/student_edition.py --out student --course _build/nbgrader

# Build it and run every student notebook top to bottom (stubs: checks say "not done yet"), by
# hand before a release (about as long as test-notebooks). `make test` runs the classroom tests
# in test-unit instead (tests/test_student.py builds the edition and checks that every stub
# reports "not done", tests/test_exercise_conventions.py that no cell after an exercise reads its
# solution; tests/test_autograde.py grades one assignment with nbgrader): the cells that stay are
# the book's, which nbval runs.
test-student: student
	$(BIN)/pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider student

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

# The GPU run's every default step (the world-1 sweep on gloo, graphs, bench, nbval plumbing,
# the GPU-path steps, record) at tiny size on a CPU, so that scripts/gpu_runner.sh cannot rot
# before a GPU day (it never touches reference/).
gpu-dry: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gpu_runner.sh --dry-run _build/gpu-dry

# Re-execute every notebook in place at the CPU DEFAULT size (never quick mode: these outputs
# are what the published pages show and what nbval compares on cells tagged nbval-check-output).
# Strips stderr, fails on an error output, records each run (seconds, peak memory, processes) in
# book/_ext/runs.json for the badges (commit it too). After editing a notebook: make outputs NB=book/x.ipynb
outputs: $(STAMP)
	env -u COURSE_QUICK -u COURSE_FULL $(BIN)/python scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build student artifacts $(BOOK_VENV)
