"""The GPU chapter's words chosen by its numbers (helpers/gpus_words.py): one test per function,
every branch, with the sentences book/gpus.ipynb glues."""
import pytest

import helpers


def test_pool_words_larger_smaller_or_unlisted_cache():
    assert helpers.pool_words(1024, 32.0) == (
        "a pool of 1,024 MiB, more than this CPU's largest cache (32 MiB)")
    assert helpers.pool_words(128, 256.0).endswith(
        "less than this CPU's largest cache (256 MiB): some copies may still find their data "
        "there")
    assert helpers.pool_words(1024) == (
        "a pool of 1,024 MiB (this system does not list its cache sizes)")


def test_one_call_words_faster_slower_or_cannot_tell():
    one, many = (5e-6, 4e-6, 6e-6), (3.4e-3, 3.2e-3, 3.5e-3)      # (median, fastest, slowest)
    assert helpers.one_call_words(one, many) == (
        "doing the work as one call was 680 times as fast, in every repeat")
    slower = helpers.one_call_words((2e-3, 1.9e-3, 2.1e-3), (1e-3, 0.9e-3, 1.1e-3))
    assert slower.startswith("doing the work as one call was slower (0.50 times as fast)")
    overlap = helpers.one_call_words((2e-3, 1e-3, 3e-3), (2.5e-3, 2e-3, 4e-3))
    assert overlap == ("the repeats of one call and of the many calls overlap (1.25 times as "
                       "fast at the medians), so this run cannot tell them apart")


def test_queued_words_every_round_medians_only_or_not_later():
    assert helpers.queued_words([1e-4, 2e-4, 1e-4], [0.1, 0.12, 0.2]) == (
        "1,200 times later, in every round")
    medians = helpers.queued_words([1e-4, 1e-4, 0.2], [0.1, 0.12, 0.15])
    assert medians.startswith("1,200 times later at the medians, though some rounds overlap")
    assert "does not explain" in helpers.queued_words([0.2, 0.3], [0.1, 0.2])


def test_copy_fit_words_fits_strays_or_falls():
    assert "one latency and one bandwidth describe every copy" in helpers.copy_fit_words(0, 1.5)
    # a high load, measured: named as the likely cause
    wide = helpers.copy_fit_words(0, 2.5, load=1.26)
    assert wide == ("this run strays from it. The machine was busy (load 1.3 per core), a likely "
                    "cause: rerun the cells on a quiet machine")
    # a low load: the machine is not blamed, the run says it does not know why
    low = helpers.copy_fit_words(0, 2.5, load=0.1)
    assert low.startswith("this run strays from it, and this run does not say why (the load was "
                          "0.1 per core, not high enough to blame): other work on the machine, "
                          "or where the memory was placed, is a likely reason, not measured")
    assert "busy" not in low
    # no load reading: nor is it blamed
    fell = helpers.copy_fit_words(2, 1.2)
    assert fell.startswith("this run strays from it: the time fell at 2 sizes although the "
                           "bytes grew, and this run does not say why: other work")
    assert "busy" not in fell and "load" not in fell
    assert "at 1 size although" in helpers.copy_fit_words(1, 1.2)
    assert "busy (load 0.6" in helpers.copy_fit_words(1, 1.2, load=0.55)
    assert "does not say why" in helpers.copy_fit_words(1, 1.2, load=0.5)
    with pytest.raises(ValueError, match="ratio >= 1"):
        helpers.copy_fit_words(0, 0.5)


def test_unsynced_timing_words_has_three_branches():
    verdict, words = helpers.unsynced_timing_words([1e-5, 2e-5, 3e-5], [3e-3, 3.1e-3, 3.2e-3])
    assert verdict == "too small" and "155 times too small in every round" in words
    verdict, words = helpers.unsynced_timing_words([5e-3, 6e-3], [1e-3, 2e-3])
    assert verdict == "too large" and words == (
        "the unsynchronised timing was larger in every round, which this run does not explain")
    verdict, words = helpers.unsynced_timing_words([1e-3, 3e-3], [2e-3, 4e-3])
    assert verdict == "cannot tell" and "cannot tell the two timings apart" in words


def test_link_specs_give_pcie4_x16_and_nvlink4_each_way():
    spec = helpers.LINK_SPECS
    pcie = spec["pcie4_gt_s"] * spec["pcie4_lanes"] * spec["pcie4_encoding"] / 8
    assert pcie == pytest.approx(31.5e9, rel=1e-3)
    assert spec["nvlink4_links"] * spec["nvlink4_link_gbs"] == 450


def test_size_growth_words_within_more_or_less():
    assert helpers.size_growth_words(64) == (
        "within a factor of 2 of the 64 that the arithmetic alone predicts")
    assert helpers.size_growth_words(32) == helpers.size_growth_words(128) == (
        helpers.size_growth_words(64))
    assert helpers.size_growth_words(129).startswith("more than the 64")
    assert helpers.size_growth_words(31).startswith("less than the 64")
    assert "does not say why" in helpers.size_growth_words(10)


def test_threads_ratio_words_faster_slower_within_noise_or_one_thread():
    # round by round, one thread's time over all threads': all > 1 is faster
    fast = helpers.threads_ratio_words(helpers.Ratio([1.8, 1.9, 2.0, 2.1, 2.2]), 2, 1024)
    assert fast == ("Timed in turns, the 1024x1024 product on 2 threads was faster than on one "
                    "(2.00 times as fast, 1.80 to 2.20 over the rounds).")
    slow_small = helpers.threads_ratio_words(helpers.Ratio([0.7, 0.75, 0.8]), 2, 256)
    assert "was slower than on one (0.75 times as fast" in slow_small
    assert "threading overhead is a likely reason" in slow_small
    slow_large = helpers.threads_ratio_words(helpers.Ratio([0.7, 0.75, 0.8]), 4, 1024)
    assert "overhead" not in slow_large and "one possible cause" in slow_large
    # a spread across 1, however far the medians lie apart: within noise
    noise = helpers.threads_ratio_words(helpers.Ratio([0.9, 2.2, 2.3]), 2, 1024)
    assert noise.endswith("are within noise of each other (2.20 times as fast, 0.90 to 2.30 "
                          "over the rounds): this run cannot tell them apart.")
    # one round: no spread, no verdict either
    assert "cannot tell them apart" in helpers.threads_ratio_words(helpers.Ratio([2.0]), 2, 64)
    assert helpers.threads_ratio_words(helpers.Ratio([1.0, 1.0]), 1, 1024) == (
        "PyTorch had one thread here, so the 1024x1024 product was timed on one thread only: "
        "this run compares no thread counts.")


def test_launch_bound_words_a_prediction_from_the_readings():
    said = helpers.launch_bound_words(16.5e-6, 51e12)
    assert said == (", by its intensity alone. A call's fixed cost (16.5 µs in the GPU "
                    "reference run: one reading of a 1 KiB copy's call; a product's launch was "
                    "not timed) outlasts the arithmetic until 2n³/P reaches it, at n ≈ 749 (a "
                    "prediction from that reading): smaller products would be bound by the call, "
                    "not by either roof")
    # twice the rate: the same call outlasts products 2^(1/3) times as large
    assert "n ≈ 944" in helpers.launch_bound_words(16.5e-6, 102e12)
    assert "the median of 5 rounds of a 1 KiB" in helpers.launch_bound_words(16.5e-6, 51e12, 5)
    # a tiny product's own call, where the run timed one, is used instead of the copy's
    product = helpers.launch_bound_words(16.5e-6, 51e12, 5, product_s=8.0e-6)
    assert "A tiny product's call (8.0 µs in the GPU reference run: ten back to back, the " \
        "median of 5 rounds)" in product and "n ≈ 589" in product
    assert "not timed" not in product
    assert "a prediction: no GPU run has measured it" in helpers.launch_bound_words(None, 51e12)
    with pytest.raises(ValueError, match="must be > 0"):
        helpers.launch_bound_words(-1e-6, 51e12)


def test_memory_pass_words_names_the_faster_pass():
    assert helpers.memory_pass_words(10e9, 10e9) == "a copy"
    assert helpers.memory_pass_words(9e9, 10e9) == "the addition"


def test_compute_roof_words_near_below_or_above():
    assert helpers.compute_roof_words(0.97) == ("near the compute roof (97% of $P$, the fastest "
                                                "reading of a separate run)")
    assert helpers.compute_roof_words(0.8).startswith("near")
    below = helpers.compute_roof_words(0.6)
    assert below.startswith("below the compute roof (60% of $P$)")
    assert "one possible cause" in below
    above = helpers.compute_roof_words(1.2)
    assert above.startswith("above the compute roof (120% of $P$)")
    assert "this $P$ is too low" in above
    with pytest.raises(ValueError, match="share"):
        helpers.compute_roof_words(0)


def test_iqr_words_wide_or_narrow():
    wide = helpers.iqr_words(0.01135, 0.01208)
    assert wide.startswith("its IQR, 11.35 ms, is 94% of the median: the middle half of its "
                           "blocks spread that widely") and "only the medians" in wide
    assert helpers.iqr_words(0.006, 0.012).startswith("its IQR, 6.00 ms, is 50% of the median: "
                                                      "the middle half of its blocks spread")
    narrow = helpers.iqr_words(0.001, 0.012)
    assert narrow.endswith("stayed close to it") and "8%" in narrow
    with pytest.raises(ValueError, match="median"):
        helpers.iqr_words(0.001, 0)


REF = dict(exists=True, gpu="GPU X", date="today", paths=dict(comm=dict(
    matmul_fp32_flops_per_s=50e12, copy_s={"1024": 1e-5, str(2**28): 1.28e-4})))
FIG = dict(mib=256, pinned_gbs=50.04, pageable_gbs=20.5, inside_gbs=3900.2, step_peak_mib=12.34,
           before_mib=1.5, one_stream_ms=3.456, two_streams_ms=2.9)


def _with(fig):
    return dict(REF, paths=dict(REF["paths"], gpus=fig))   # the runner's gpus step


def test_reference_chapter_figures_only_from_a_gpu():
    assert helpers.reference_chapter_figures(_with(FIG)) == FIG
    dry = _with(dict(timer=dict(n=64, reps=2, rounds=2), wrong_s=[1e-5] * 2,
                     right_s=[1e-5] * 2, device="cpu"))   # a dry run's CPU: nothing to quote
    assert helpers.reference_chapter_figures(dry) is None
    assert helpers.reference_chapter_figures(REF) is None
    assert helpers.reference_chapter_figures(None) is None


WORK = dict(n=4096, reps=10, rounds=3)


def test_reference_timer_words_recorded_noted_or_a_prediction():
    fig = dict(FIG, timer=WORK, wrong_s=[1e-4, 1.1e-4, 1.2e-4], right_s=[2.7e-3, 2.8e-3, 2.9e-3])
    assert helpers.reference_timer_words(_with(fig), WORK) == (
        " In the GPU reference run (GPU X, today), with 4096x4096 products in 3 rounds, the "
        "unsynchronised timing was 25 times too small in every round: it timed the queueing; "
        "synchronised, a product took 2.80 ms (49.1 TFLOP/s).")
    overlap = dict(fig, wrong_s=[1e-4, 1.1e-4, 2.75e-3])
    assert "the rounds overlap, so this run cannot tell" in helpers.reference_timer_words(
        _with(overlap), WORK)
    # another product than the chapter's: not quoted as its reading
    other = helpers.reference_timer_words(_with(fig), dict(WORK, n=1024))
    assert other == (" No GPU run has recorded these two timings yet (the GPU reference run "
                     "executed this chapter's code, but it stores only whether each cell ran "
                     "through, not the figures the cells print): that a reading without "
                     "synchronising is too small is a prediction.")
    assert helpers.reference_timer_words(REF, WORK) == other
    # said once: the note on the run's failed cell already calls the section a prediction
    assert helpers.reference_timer_words(REF, WORK, noted=True) == ""
    assert helpers.reference_timer_words(_with(fig), WORK, noted=True).startswith(
        " In the GPU reference run")


def test_gpu_roofs_measured_or_from_the_datasheet():
    peak, bw, words = helpers.gpu_roofs(REF)
    assert peak == 50e12 and bw == pytest.approx(2 * 2**28 / 1.28e-4)
    assert words == ("measured by the GPU reference run, today, on its GPU X: a 4096x4096 "
                     "float32 product without TF32, and a copy of 256 MiB inside its memory")
    peak, bw, words = helpers.gpu_roofs(dict(exists=False))
    assert (peak, bw) == (67e12, 4.8e12) and words == (
        "a prediction from NVIDIA's H200 datasheet (67 TFLOP/s float32, 4.8 TB/s): no GPU "
        "reference run records them yet")


def test_reference_copies_words_recorded_or_not():
    assert helpers.reference_copies_words(_with(FIG)) == (
        " In the GPU reference run (GPU X, today), 256 MiB moved at 50.0 GB/s from pinned memory "
        "and 20.5 GB/s from pageable memory (CUDA events), while a copy inside the GPU's memory "
        "ran at 3900 GB/s (each byte counted once, as over the link). Pinned memory was 2.4 times "
        "as fast.")
    ran = helpers.reference_copies_words(REF)
    assert ran == (" No GPU run has recorded these copies yet (the GPU reference run executed "
                   "this chapter's code, but it stores only whether each cell ran through, not "
                   "the figures the cells print): pinned memory is expected to be the faster (a "
                   "prediction).")
    assert "nbval" not in ran
    assert helpers.reference_copies_words(dict(exists=False)) == (
        " No GPU run has recorded these copies yet: pinned memory is expected to be the faster "
        "(a prediction).")


def test_reference_link_words_two_gpus_one_or_none():
    two = helpers.reference_link_words(_with(dict(FIG, gpu_to_gpu_gbs=300.0, p2p=True)))
    assert two.endswith("a copy of 256 MiB from cuda:0 to cuda:1 (P2P) ran at 300.0 GB/s.")
    host = helpers.reference_link_words(_with(dict(FIG, gpu_to_gpu_gbs=9.0, p2p=False)))
    assert "(via the host)" in host
    assert "had one GPU" in helpers.reference_link_words(_with(FIG))
    assert helpers.reference_link_words(REF) == ""


def test_reference_memory_and_streams_words():
    assert helpers.reference_memory_words(_with(FIG)).endswith(
        "peaked at 12.3 MiB above the 1.5 MiB allocated before it.")
    assert helpers.reference_memory_words(REF) == ""
    assert helpers.reference_streams_words(_with(FIG)).endswith(
        "took 3.46 ms on one stream and 2.90 ms with the copy on a second stream. The second "
        "stream made the pair 1.2 times as fast: the copy ran while the product did.")
    assert helpers.reference_streams_words(REF).endswith(
        "not the figures the cells print): the overlap described above is a prediction.")


def test_pinned_words_faster_slower_or_cannot_tell():
    assert helpers.pinned_words(50.0, 20.0) == " Pinned memory was 2.5 times as fast."
    assert "slower here (0.50 times" in helpers.pinned_words(10.0, 20.0)
    assert "cannot tell them apart" in helpers.pinned_words(21.0, 20.0)
    assert "cannot tell them apart" in helpers.pinned_words(20.0, 21.0)


def test_link_cost_words_costlier_cheaper_cannot_tell_or_a_prediction():
    assert helpers.link_cost_words(3900.0, 50.0, 20.0) == (
        "A copy over the link cost 78 times as much per byte as one inside the GPU's memory, "
        "from the faster of the two host memories")
    assert "does not explain" in helpers.link_cost_words(10.0, 50.0, 20.0)
    assert "cannot tell them apart" in helpers.link_cost_words(52.0, 50.0, 20.0)
    assert "(a prediction)" in helpers.link_cost_words()


def test_overlap_words_faster_slower_or_cannot_tell():
    assert "made the pair 2.0 times as fast: the copy ran while the product did" in (
        helpers.overlap_words(8e-3, 4e-3))
    assert "did not hide behind the product" in helpers.overlap_words(4e-3, 8e-3)
    assert "cannot tell whether the copy overlapped" in helpers.overlap_words(4e-3, 4.2e-3)


def test_call_share_words_decided_from_the_rounds():
    roof = 0.1e-6                                   # beyond it: 2.0 µs in every round below
    small = [2.1e-6] * 3
    most = helpers.call_share_words([1.2e-6, 1.6e-6, 1.9e-6], small, roof)
    assert most == ("; most of it is the call itself: a bare 1x1 call took from 60% to 95% of "
                    "it round by round (median 80%); this run does not say what the rest is")
    over = helpers.call_share_words([1.2e-6, 1.6e-6, 2.4e-6], small, roof)
    assert "to 120% of it" in over and "above 100% where the bare call was the slower" in over
    little = helpers.call_share_words([0.2e-6, 0.4e-6, 0.9e-6], small, roof)
    assert little.startswith("; a bare 1x1 call took only from 10% to 45% of it")
    assert "most of it is not the bare call's cost" in little
    # one round under half, the others over: the median alone would say "most"
    straddle = helpers.call_share_words([0.8e-6, 1.6e-6, 1.9e-6], small, roof)
    assert straddle.endswith("on both sides of half: this run cannot tell how much of it is "
                             "the call")
    # paired by round: each bare call against the small call of its own round
    paired = helpers.call_share_words([1.0e-6, 2.0e-6], [1.1e-6, 4.1e-6], roof)
    assert "from 50% to 100%" in paired
    with pytest.raises(ValueError, match="must be > 0"):
        helpers.call_share_words([1e-6], [0.1e-6], roof)
    with pytest.raises(ValueError, match="the same rounds"):
        helpers.call_share_words([1e-6, 1e-6], [2e-6], roof)


def test_call_share_summary_quotes_only_what_the_verdict_supports():
    roof, small = 0.1e-6, [2.1e-6] * 3
    most = helpers.call_share_summary([1.2e-6, 1.6e-6, 1.9e-6], small, roof)
    assert most == ("; a bare 1x1 call, timed in turns with it, took 60% to 95% of the time a "
                    "16x16 call spent beyond the roof, round by round: most of that time is "
                    "the call")
    assert helpers.call_share_summary([0.2e-6, 0.4e-6, 0.9e-6], small, roof).endswith(
        "most of that time is not the bare call")
    straddle = helpers.call_share_summary([0.8e-6, 1.6e-6, 1.9e-6], small, roof)
    assert straddle.endswith("so this run cannot tell how much of that time is the call")
    assert "most of that time is the call" not in straddle


def test_fit_ends_words_below_above_or_cannot_tell():
    smallest = (64, (1.03e-6, 1.00e-6, 1.06e-6))           # alpha from 1.00 to 1.06 µs
    largest = (2**26, (7.41e-3, 7.30e-3, 7.50e-3))         # beta from 8.9 to 9.2 GB/s
    inside = helpers.fit_ends_words(1.04e-6, 9.1, smallest, largest)
    assert inside == (
        "The fit's α, 1.04 µs, is within the range of the smallest copy's readings (1.00 µs to "
        "1.06 µs), so this run cannot tell it from the chapter's; the fit's β, 9.1 GB/s, is "
        "within the range the largest copy's readings give (8.9 GB/s to 9.2 GB/s), so this run "
        "cannot tell it from the chapter's.")
    apart = helpers.fit_ends_words(1.08e-6, 8.7, smallest, largest)
    assert apart.startswith("The fit's α, 1.08 µs, is above the range of the smallest copy's")
    assert "the fit's β, 8.7 GB/s, is below the range the largest" in apart
    assert "cannot tell" not in apart
    other_way = helpers.fit_ends_words(0.90e-6, 9.5, smallest, largest)
    assert "α, 0.90 µs, is below" in other_way and "β, 9.5 GB/s, is above" in other_way
    # a fastest reading of the largest copy no longer than alpha: beta has no upper limit
    unbounded = helpers.fit_ends_words(1.04e-6, 50.0, smallest, (64, (1.1e-6, 1.0e-6, 1.2e-6)))
    assert "to no limit), so this run cannot tell" in unbounded
    with pytest.raises(ValueError, match="median, fastest, slowest"):
        helpers.fit_ends_words(1e-6, 9.0, (64, (1.0e-6, 1.1e-6, 1.2e-6)), largest)


def test_cache_copy_words_faster_slower_or_cannot_tell():
    walk = "a pool of 512 MiB"
    faster = helpers.cache_copy_words(helpers.Ratio([1.8, 2.1, 2.4]), 2**18, walk)
    assert faster == ("Timed in turns, one buffer of 256 KiB copied again and again, read from "
                      "the caches, against copies of that size walking the pool, read from main "
                      "memory: the one buffer was faster (1.80-2.40 times as fast, 3 rounds). "
                      "That is why the copies walk a pool of 512 MiB.")
    slower = helpers.cache_copy_words(helpers.Ratio([0.7, 0.8, 0.9]), 2**20, walk)
    assert "one buffer of 1 MiB" in slower and "was slower" in slower
    assert "this run does not say why" in slower and "That is why" not in slower
    noise = helpers.cache_copy_words(helpers.Ratio([0.9, 1.1, 1.3]), 2**18, walk)
    assert "this run cannot tell them apart" in noise and "That is why" not in noise
