# Two commands do all the set-up on a fresh machine (see README):
#   make book   build the HTML book into _build/html (creates .venv on first use)
#   make test   run every test: lint, unit tests, notebooks under nbval, the book build, the browser
#               test, the Colab emulation, the student edition
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements/lock.txt
JB     := $(BIN)/jupyter-book build . --all -W -n --keep-going
export TQDM_DISABLE := 1
export PYTHONUNBUFFERED := 1

.PHONY: book test lint test-unit test-notebooks test-book test-browser student test-student bench gpu-dry \
	outputs lock venv clean

# The venv from the lock file: every package pinned with its hash (requirements/lock.txt).
$(STAMP): $(LOCK) pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11 or newer is needed (numpy 2.4)" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

venv: $(STAMP)

# Re-resolve requirements.txt (the groups under requirements/) into the lock, with hashes, using
# uv from a throwaway venv under _build/ (never the course's venv).
lock:
	[ -x _build/uv/bin/uv ] || ($(PYTHON) -m venv _build/uv && _build/uv/bin/pip install --quiet uv==0.13.8)
	_build/uv/bin/uv pip compile requirements.txt --generate-hashes --universal --python-version 3.11 \
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

# Everything CI runs, in quick mode (COURSE_QUICK=1): minutes on 2 CPU cores. Safe under make -j:
# test-browser depends on test-book, the book it tests.
test: export COURSE_QUICK := 1
test: $(STAMP) lint test-unit test-notebooks test-book test-browser test-student bench gpu-dry

# ruff: Python files at 100 columns, notebooks at 79 (book/ruff.toml); config in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .

# Unit tests, the book's consistency tests and the Colab emulation (tests/test_colab.py).
test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests --ignore=tests/browser

test-notebooks: $(STAMP)
	$(BIN)/pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider book

# The book from the stored outputs, without executing the notebooks (nbval runs them above; the
# outputs are those `make outputs` stored at the CPU default size). `make book` executes them.
test-book: $(STAMP)
	rm -rf _build/html _build/.doctrees
	$(BIN)/python scripts/book_config.py --execute off --out _build/_config.test.yml
	$(JB) --config _build/_config.test.yml

# Every page of _build/html (built by test-book) in headless Debian Chromium, offline, with
# axe-core (node_modules/, from package-lock.json) in light and dark mode; screenshots in
# artifacts/screenshots/. Installs chromium when missing and run as root (Playwright's own
# browser download fails here; see tests/browser/conftest.py).
test-browser: $(STAMP) test-book node_modules/.installed
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/pytest -q -p no:cacheprovider tests/browser

# The pinned JavaScript (axe-core for the browser test), with integrity hashes from the lock.
node_modules/.installed: package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $@

# The student edition (book/teachers.md): solutions replaced by stubs, outputs cleared, checks kept;
# nbgrader's generate_assignment does it. Also an nbgrader course folder (gradebook) in _build/nbgrader.
student: $(STAMP)
	$(BIN)/python scripts/student_edition.py --out student --course _build/nbgrader

# Build it and run every student notebook top to bottom (stubs: checks say "not done yet").
# The classroom tests themselves (tests/test_student.py, tests/test_checks_*.py) run in test-unit.
test-student: student
	$(BIN)/pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider student

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

# The GPU reference run's every step (unit tests, nbval, bench, record) at tiny size on a CPU, so
# that scripts/gpu_runner.sh cannot rot before a GPU day (it never touches reference/).
gpu-dry: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gpu_runner.sh --dry-run _build/gpu-dry

# Re-execute every notebook in place at the CPU DEFAULT size (never quick mode: these outputs
# are what the published pages show and what nbval compares on cells tagged nbval-check-output).
# Strips stderr, fails on an error output. Run after editing a notebook: make outputs NB=book/x.ipynb
outputs: $(STAMP)
	env -u COURSE_QUICK -u COURSE_FULL $(BIN)/python scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build student artifacts
