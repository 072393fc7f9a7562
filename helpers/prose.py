"""Prose that follows the run: the claims a page makes about its own measurements, asserted.

A sentence such as "two workers were faster than one" is computed from the measurement (glued),
and a hidden cell beside it (tagged remove-cell) calls `claim(t2 < t1, "two workers are faster
than one")`. When a run contradicts the sentence, `make outputs` stops with ClaimFailed naming
the claim, instead of storing a page that says the opposite of its numbers.
"""

import os
import string
import sys

__all__ = ["ClaimFailed", "claim", "say", "glued", "formatted"]

_differs = []   # claims this reader's run did not bear out, for the next say()


class ClaimFailed(AssertionError):
    """A measured claim of the prose does not hold in this run."""


def strict_claims():
    """Whether a failed claim stops the run: where outputs are stored or tested
    (`make outputs`, `make test` set COURSE_CLAIMS=strict), not in a reader's own run."""
    return os.environ.get("COURSE_CLAIMS", "") == "strict"


def claim(holds, says, **measured):
    """Assert that `says` (the prose's claim, in its words) holds in this run.

    `measured` names the figures behind it; they are shown when the claim fails. Under
    COURSE_CLAIMS=strict (the author's `make outputs`, CI) a failed claim raises ClaimFailed, so no
    page that contradicts its numbers is stored. In a reader's run (a busy laptop, another GPU)
    it does not stop Run All: it prints a line, and the next say() shows the reader that their run
    differs from the sentence. Returns None: a claim cell shows nothing when the claim holds."""
    figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in measured.items())
    if holds:
        return
    measured_text = f" ({figures})" if figures else ""
    if strict_claims():
        raise ClaimFailed(f"the text claims that {says}, but this run measured otherwise"
                          f"{measured_text}: rerun on a quiet machine, or change the text")
    _differs.append(f"the text says that {says}, but your run measured otherwise{measured_text}")
    print(f"Note: {_differs[-1]}.", file=sys.stderr)


# ---------------------------------------------------------------- prose that carries numbers
# The notebooks' prose reads the same in the book, JupyterLab, Colab, VS Code and on GitHub:
# a paragraph with measured numbers is a hidden code cell `helpers.say("""... {name:.2f} ...""")`
# (scripts/reader_markup.py writes them) that displays Markdown with the values glued earlier in
# this kernel (helpers.glue records them here). Literal braces are doubled, as in str.format.

_glued = {}
# The published book (_config.yml html.baseurl; tests/test_reader_markup.py keeps them equal):
# `{book}` in a say() text, so that a link to the glossary fits a notebook's 79 columns.
BOOK_URL = "https://multigpu-course.github.io/multigpu-course/"


class _Missing(KeyError):
    pass


def remember(name, value):
    """Record a glued value for say() (helpers.glue calls it)."""
    _glued[name] = value


def glued():
    """The values glued so far in this process, by name."""
    return dict(_glued)


class _Formatter(string.Formatter):
    """str.format, except that a number glued as text takes a number's format (as myst-nb's
    {glue:text}`name:.2f` does with the text of the value), and that `{n:d|round|rounds}` gives
    "1 round" or "3 rounds" (the number in the format before the first `|`, then the word that
    agrees with it)."""

    def format_field(self, value, spec):
        if "|" in spec:
            spec, one, many = (spec.split("|") + ["", ""])[:3]
            if not one or not many:
                raise ValueError(f"plural format {spec}|{one}|{many}: write "
                                 "{name:fmt|singular|plural}, e.g. {n:d|round|rounds}")
            word = one if float(value) == 1 else many
            return f"{self.format_field(value, spec)} {word}"
        try:
            return format(value, spec)
        except (ValueError, TypeError):
            if isinstance(value, str):
                return format(float(value), spec)
            raise


def formatted(text, values=None):
    """`text` with its {name:fmt} fields filled from `values` (default: the glued values), and
    {book} with the published book's address.

    A field naming nothing glued raises a KeyError that names it and says where it comes from."""
    values = {"book": BOOK_URL, **(_glued if values is None else values)}
    try:
        return _Formatter().vformat(text, (), values)
    except KeyError as e:
        raise _Missing(f"the text uses {e.args[0]!r}, which no cell has glued yet: run the "
                       "cells above (helpers.glue) first") from None


def say(text):
    """Display `text` (Markdown with {name:fmt} fields) with this run's numbers.

    In Jupyter it is rendered as Markdown (the book shows it as prose); elsewhere it prints."""
    from .config import in_notebook
    out = formatted(text.strip("\n"))
    if _differs:   # a claim above failed in this (reader's) run: say so beside the prose
        notes = "".join(f"\n> **Your run differs from the text:** {d}.\n>" for d in _differs)
        out = notes.rstrip(">") + "\n" + out
        _differs.clear()
    if in_notebook():
        from IPython.display import Markdown, display
        display(Markdown(out))
    else:
        print(out)
