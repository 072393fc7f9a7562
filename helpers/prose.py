"""Prose that follows the run: the claims a page makes about its own measurements, asserted.

A sentence such as "two workers were faster than one" is computed from the measurement (glued),
and a hidden cell beside it (tagged remove-cell) calls `claim(t2 < t1, "two workers are faster
than one")`. When a run contradicts the sentence, `make outputs` stops with ClaimFailed naming
the claim, instead of storing a page that says the opposite of its numbers.
"""

__all__ = ["ClaimFailed", "claim", "claims_made"]

_made = []


class ClaimFailed(AssertionError):
    """A measured claim of the prose does not hold in this run."""


def claim(holds, says, **measured):
    """Assert that `says` (the prose's claim, in its words) holds in this run.

    `measured` names the figures behind it; they are shown when the claim fails."""
    figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in measured.items())
    if not holds:
        raise ClaimFailed(f"the text claims that {says}, but this run measured otherwise"
                          + (f" ({figures})" if figures else "")
                          + ": rerun on a quiet machine, or change the text")
    _made.append(says)
    return True


def claims_made():
    """The claims asserted so far in this process (what a page's hidden cells checked)."""
    return list(_made)
