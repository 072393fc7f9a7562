# Two commands do all the set-up on a fresh machine (see README):
#   make book   build the HTML book into _build/html (creates .venv on first use)
#   make test   run every test: unit tests, notebooks under nbval, the book build, the browser test
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JB     := $(BIN)/jupyter-book build . --all -W -n --keep-going
export TQDM_DISABLE := 1
export PYTHONUNBUFFERED := 1

.PHONY: book test test-unit test-notebooks test-book test-browser student test-student bench outputs clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

venv: $(STAMP)

book: $(STAMP)
	$(JB)
	@echo "The book is in _build/html/ (open _build/html/index.html)"

# Everything CI runs, in quick mode (COURSE_QUICK=1): minutes on 2 CPU cores.
test: export COURSE_QUICK := 1
test: $(STAMP) test-unit test-notebooks test-book test-browser test-student bench

test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests --ignore=tests/browser

test-notebooks: $(STAMP)
	$(BIN)/pytest -q --nbval-lax --nbval-current-env -p no:cacheprovider book

test-book: $(STAMP)
	rm -rf _build/html _build/.doctrees
	$(JB)

# Every page of _build/html (built by test-book) in headless Debian Chromium, offline; screenshots
# in artifacts/screenshots/. Installs chromium when missing and run as root (Playwright's own
# browser download fails here; see tests/browser/conftest.py).
test-browser: $(STAMP)
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/pytest -q -p no:cacheprovider tests/browser

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

# Re-execute every notebook in place (quick mode, CPU) to refresh the stored outputs that nbval
# compares (cells tagged nbval-check-output). Run after editing a notebook.
outputs: export COURSE_QUICK := 1
outputs: $(STAMP)
	$(BIN)/python scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build student artifacts
