"""Fixtures for the browser tests: headless Debian Chromium driven by Playwright, a local server.

Which book: the repository's own (its `_toc.yml`, `_build/html` built by `make test-book`), or
another one with `--book-dir DIR` / `COURSE_BOOK_DIR=DIR` (a small scratch book while developing).
"""
import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import book_files  # noqa: E402
from pagecheck import serve, toc_entries_of  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Offline: no host name resolves but the local server's 127.0.0.1 (the book must work offline;
# pageserve.open_page notes the requests that fail so)
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", OFFLINE]
FIX = ("install it with `apt-get install -y chromium` (Debian/Ubuntu; `make test-browser` does it "
       "when run as root) and `pip install -r requirements.txt` for Playwright; never "
       "`playwright install`, whose download fails here")


def pytest_addoption(parser):
    parser.addoption("--book-dir", default=os.environ.get("COURSE_BOOK_DIR"),
                     help="book source folder (with _toc.yml, _config.yml, _build/html); "
                          "default: the repository")


def _missing(msg):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg}: {FIX}", pytrace=False)
    pytest.skip(f"{msg}: {FIX}")


@pytest.fixture(scope="session")
def book_dir(pytestconfig):
    return pathlib.Path(pytestconfig.getoption("book_dir") or book_files.ROOT).resolve()


@pytest.fixture(scope="session")
def site(book_dir):
    html = book_dir / "_build" / "html"
    if not (html / "search.html").is_file():
        pytest.fail(f"no built book in {html}: build it first (`make test-book`, or "
                    f"`jupyter-book build {book_dir} -W -n --keep-going`)", pytrace=False)
    return html


# When this process started collecting: under xdist every worker collects before any test runs,
# so a file older than this is a previous run's, and never another worker's of this run
_STARTED = time.time()


@pytest.fixture(scope="session")
def shots(book_dir):
    """artifacts/screenshots/, holding this run's pages only: a previous run's files are deleted,
    another worker's of this run kept (a worker may reach its first browser test minutes after
    the other has written its pages, when the browser tests share a run with the others)."""
    d = book_dir / "artifacts" / "screenshots"
    d.mkdir(parents=True, exist_ok=True)
    for f in d.iterdir():
        try:
            if f.stat().st_mtime < _STARTED:
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        except FileNotFoundError:    # the other worker deleted it first
            pass
    return d


@pytest.fixture(scope="session")
def book_config(book_dir):
    return yaml.safe_load((book_dir / "_config.yml").read_text())


@pytest.fixture(scope="session")
def base_url(site):
    with serve(site) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        _missing(f"Chromium is missing ({CHROMIUM})")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is missing")
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    with sync_playwright() as pw:
        # a persistent context on a fresh, empty profile: the user data dir the notes ask for
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, service_workers="block")
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def pytest_generate_tests(metafunc):
    if "entry" in metafunc.fixturenames:
        book = metafunc.config.getoption("book_dir") or book_files.ROOT
        metafunc.parametrize("entry", toc_entries_of(book))
