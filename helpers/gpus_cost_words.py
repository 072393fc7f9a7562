"""Words the GPU chapter (book/gpus.ipynb) chooses about what a call or a copy costs beyond
its model, each decided from rounds timed in turns: a bare call's share of a small product's time
beyond its roof, and one buffer copied again and again against copies walking a pool. Tested in
tests/test_gpus_words.py."""
import statistics

__all__ = ["call_share_words", "call_share_summary", "cache_copy_words"]

MOST = 0.5      # a bare call's share of the time beyond the roof: "most of it" from here


def _call_shares(call_rounds, small_rounds, roof_s):
    """A bare call's share of what a small product took beyond its roof, round by round:
    `call_rounds` and `small_rounds` the seconds a call of each took in the same rounds (timed in
    turns), `roof_s` what the roof allows the small product. Returns (lowest, median, highest)."""
    if len(call_rounds) != len(small_rounds) or not call_rounds:
        raise ValueError("call_share: one time of each call a round, the same rounds")
    rests = [s - roof_s for s in small_rounds]
    if min(rests) <= 0:
        raise ValueError(f"call_share: the time beyond the roof must be > 0, not {min(rests)}")
    shares = sorted(c / r for c, r in zip(call_rounds, rests, strict=True))
    return shares[0], statistics.median(shares), shares[-1]


def call_share_words(call_rounds, small_rounds, roof_s):
    """What a bare call (a 1x1 product) says of the time a small product took beyond its roof,
    decided from the rounds (see _call_shares), as a clause after "what the roofline leaves
    out": most of it in every round, less than most in every round, or this run cannot tell."""
    lo, mid, hi = _call_shares(call_rounds, small_rounds, roof_s)
    spread = f"from {lo:.0%} to {hi:.0%} of it round by round (median {mid:.0%})"
    if lo >= MOST:
        over = (": above 100% where the bare call was the slower of the two" if hi > 1
                else "")
        return (f"; most of it is the call itself: a bare 1x1 call took {spread}{over}; this "
                "run does not say what the rest is")
    if hi < MOST:
        return (f"; a bare 1x1 call took only {spread}: most of it is not the bare call's cost, "
                "and this run does not say what it is")
    return (f"; a bare 1x1 call took {spread}, on both sides of half: this run cannot tell how "
            "much of it is the call")


def call_share_summary(call_rounds, small_rounds, roof_s):
    """The summary's clause for the same verdict as call_share_words (after "... at N% of it
    here"): only what the rounds support."""
    lo, _, hi = _call_shares(call_rounds, small_rounds, roof_s)
    took = (f"a bare 1x1 call, timed in turns with it, took {lo:.0%} to {hi:.0%} of the time a "
            "16x16 call spent beyond the roof, round by round")
    if lo >= MOST:
        return f"; {took}: most of that time is the call"
    if hi < MOST:
        return f"; {took}: most of that time is not the bare call"
    return f"; {took}, so this run cannot tell how much of that time is the call"


def cache_copy_words(r, nbytes, pool_words):
    """One buffer of `nbytes` copied again and again (from the caches) against copies walking
    the pool (from main memory), `r` a helpers.Ratio of the pool's time over the one buffer's,
    round by round; `pool_words` what the copies walk (pool_words). A sentence: faster, slower,
    or this run cannot tell."""
    size = f"{nbytes / 2**10:,.0f} KiB" if nbytes < 2**20 else f"{nbytes / 2**20:,.0f} MiB"
    what = (f"Timed in turns, one buffer of {size} copied again and again, read from the "
            "caches, against copies of that size walking the pool, read from main memory")
    spread = f"{r.lo:.2f}-{r.hi:.2f} times as fast, {len(r.samples)} rounds"
    if r.verdict == "faster":
        return (f"{what}: the one buffer was faster ({spread}). That is why the copies walk "
                f"{pool_words}.")
    if r.verdict == "slower":
        return (f"{what}: the one buffer was slower ({spread}); this run does not say why. The "
                f"copies walk {pool_words} all the same, as a copy over a link is capped by the "
                "link, not by a cache.")
    return (f"{what}: within noise of each other ({spread}), so this run cannot tell them apart "
            f"at this size. The copies walk {pool_words} all the same, as a copy over a link is "
            "capped by the link, not by a cache.")
