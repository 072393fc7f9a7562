"""Serve a built book on 127.0.0.1 and open its pages in Chromium (Playwright) as a reader would,
offline: `open_page` blocks every request outside the local server and records console errors
and failed local requests; `settle`, `resize` and `wait_rendered` wait for the page to render.
The checks of what the page shows: pagecheck.py."""
import contextlib
import functools
import http.server
import pathlib
import re
import threading
from unittest import mock

import book_files

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
MIN_FIGURE = 100          # px: a figure a notebook produced is at least this wide and high
RENDER_TIMEOUT_MS = 15_000
TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\)|^\s*[A-Z]\w*(Error|Exception): \S",
                          re.M)


def toc_entries_of(book_dir):
    with mock.patch.object(book_files, "ROOT", pathlib.Path(book_dir)):
        return book_files.toc_entries()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Quiet, and its files cacheable: a page's scripts and styles (the theme's, MathJax, the
    widget manager, mostly the same on every page) come from Chromium's cache, compiled code
    included, after the first page of a run instead of being served and parsed again. An error
    (a missing file) is not cached: every page that asks for it is told so."""

    def log_message(self, *args):
        pass

    def send_response(self, code, message=None):
        super().send_response(code, message)
        if code == 200:
            self.send_header("Cache-Control", "max-age=3600")


@contextlib.contextmanager
def serve(directory):
    """Serve `directory` on 127.0.0.1 at a free port; yields the base URL (ending in /)."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class Page:
    """A loaded page and what the browser saw while loading it."""

    def __init__(self, page, url):
        self.page, self.url = page, url
        self.console_errors, self.local_failures, self.blocked = [], [], []


# The browser resolves no host name but 127.0.0.1 (conftest.py's OFFLINE): a request outside
# the local server fails at once with this error, inside Chromium. Blocking each request through
# Playwright's routes instead has Chromium pause every request for the driver, with its cache off.
OFFLINE_ERROR = "net::ERR_NAME_NOT_RESOLVED"


def open_page(context, url, base, timeout=RENDER_TIMEOUT_MS):
    """Open `url` in a new tab of `context` (a browser started offline: conftest.py); requests
    outside `base` fail and are noted. Waits up to `timeout` ms for math, widgets and images to
    render."""
    page = context.new_page()
    seen = Page(page, url)

    def on_console(msg):
        if msg.type != "error":
            return
        where = (msg.location or {}).get("url", "")
        if OFFLINE_ERROR in msg.text or (where and not where.startswith(base)
                                         and "Failed to load resource" in msg.text):
            return   # an external request we blocked on purpose; it is listed in seen.blocked
        seen.console_errors.append(f"{msg.text} ({where})" if where else msg.text)

    # a new reader's page: no theme chosen before (the context is shared, and the theme's switch,
    # which test_page's dark-mode pass clicks, stores its choice in localStorage), so the theme
    # follows the system's, light here
    page.add_init_script("localStorage.removeItem('theme'); localStorage.removeItem('mode');")
    page.on("console", on_console)
    page.on("pageerror", lambda exc: seen.console_errors.append(
        f"uncaught {getattr(exc, 'name', None) or 'Error'}: {getattr(exc, 'message', exc)}"))

    def on_failed(req):
        if req.url.startswith(base):
            seen.local_failures.append(f"{req.url} ({req.failure})")
        elif not req.url.startswith("data:") and OFFLINE_ERROR in (req.failure or ""):
            seen.blocked.append(req.url)

    page.on("requestfailed", on_failed)
    page.on("response", lambda resp: resp.url.startswith(base) and resp.status >= 400 and
            seen.local_failures.append(f"{resp.url} (HTTP {resp.status})"))
    page.goto(url, wait_until="load")
    wait_rendered(page, timeout)
    return seen


_TIMED_OUT = "pagecheck: the page never settled this promise"


def settle(page, js, arg=None, seconds=10.0, what="the page"):
    """page.evaluate(js, arg) of a function returning a promise, refused after `seconds`:
    Playwright's evaluate has no timeout, and a promise the page never settles (a paused
    animation's `finished`, a MathJax start that failed, a frame a stalled tab never draws)
    hung the whole run. Raises TimeoutError naming `what`."""
    bounded = (f"async (arg) => {{ let t; const limit = new Promise((_, no) => {{ t = setTimeout("
               f"() => no(new Error({_TIMED_OUT!r})), {int(seconds * 1000)}); }});"
               f" try {{ return await Promise.race([({js})(arg), limit]); }}"
               f" finally {{ clearTimeout(t); }} }}")
    try:
        return page.evaluate(bounded, arg)
    except Exception as e:
        if _TIMED_OUT in str(e):
            raise TimeoutError(f"{what} did not finish within {seconds:g} s") from None
        raise


FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def resize(page, width, height=None):
    """Set the viewport and wait until the page is laid out at the new width: the width's media
    queries apply and two frames have been drawn. A fixed pause was not enough on a busy machine
    (CI once measured a phone-width table at its desktop width)."""
    height = height or (page.viewport_size or {}).get("height", 900)
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_function(
        "w => window.innerWidth === w && matchMedia(`(max-width: ${w}px)`).matches "
        "&& matchMedia(`(min-width: ${w}px)`).matches", arg=width, timeout=10_000)
    settle(page, FRAMES, what=f"two frames drawn at {width} px")
    # and until the width's CSS transitions have ended: the theme slides its sidebars off
    # screen at phone width, and one caught halfway covered the page's right edge. Running
    # ones only (a paused animation's `finished` never settles), and for 10 s at most: on a
    # busy machine a 0.15 s transition once had not finished after 10 s (and, unbounded, hung
    # the run for 20 minutes); the width's layout holds by then (its media queries, two frames)
    with contextlib.suppress(TimeoutError):
        settle(page, "() => Promise.all(document.getAnimations()"
                     ".filter(a => a.playState === 'running'"
                     " && a.effect?.getComputedTiming().iterations !== Infinity)"
                     ".map(a => a.finished.catch(() => null)))",
               what=f"the running animations at {width} px")


# Everything that renders after `load`: MathJax typesetting, the widget manager, lazy images.
_RENDERED_JS = """() => {
  const math = [...document.querySelectorAll('.math')];
  if (math.length && !(window.MathJax && MathJax.startup)) return false;
  if (math.some(m => !m.querySelector('mjx-container'))) return false;
  const views = [...document.querySelectorAll('script[type="%s"]')];
  if (views.length && !views.every(v => v.previousElementSibling &&
        v.previousElementSibling.classList.contains('widget-subarea') &&
        v.previousElementSibling.childElementCount > 0)) return false;
  return [...document.images].every(i => i.complete);
}""" % VIEW_MIME   # noqa: UP031 - JavaScript braces read better than {{ }}


def wait_rendered(page, timeout=RENDER_TIMEOUT_MS):
    """Wait until math, widgets and images are rendered; a page that never gets there is reported
    by check_page (this only waits)."""
    try:
        page.wait_for_function(_RENDERED_JS, timeout=timeout, polling=100)
    except Exception:   # the checks below say what is missing
        pass
    try:   # MathJax may still be laying out the last expressions
        settle(page, "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
               seconds=timeout / 1000, what="MathJax's start")
    except Exception:
        pass
