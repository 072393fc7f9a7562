"""The profile and ddp_scratch chapters' sentences
(helpers/data_parallel/words/profile_verdicts.py): a branch per verdict, and a cause named only
where a measurement resolved it."""
import pytest

import helpers

FASTER = helpers.Ratio([1.2, 1.3, 1.4])
SLOWER = helpers.Ratio([0.7, 0.8, 0.9])
NOISE = helpers.Ratio([0.9, 1.1, 1.3])
ONE = helpers.Ratio([1.5])


def test_simulated_devices_name_the_half_batches_only_when_the_control_resolved_them():
    words = helpers.simulated_devices_words
    assert words(SLOWER, NOISE).startswith("slower than one (0.80x (0.70-0.90, 3 rounds))")
    noise = words(NOISE, FASTER)
    assert noise.startswith("within noise of one") and "half" not in noise
    assert noise.count("within noise") == 1, "the verdict is said once"
    both = words(FASTER, FASTER)
    assert "The half batches, not a second device, made the step shorter" in both
    assert "this run does not say" in both      # why a half batch costs less: not measured
    alone = words(FASTER, NOISE)
    assert "does not say why" in alone and "made the step shorter" not in alone
    assert "one round" in words(ONE, ONE)
    with pytest.raises(TypeError, match="helpers.Ratio"):
        words(1.2, NOISE)


def test_the_same_code_in_two_cells_points_beside_the_code_only_when_resolved():
    slower = helpers.same_code_words(SLOWER)
    assert "what changed between the two cells is what ran beside it" in slower
    assert "does not separate them" in slower        # no neighbour named as the cause
    assert "ran beside it" in helpers.same_code_words(FASTER)
    noise = helpers.same_code_words(NOISE)
    assert "cannot be told apart" in noise and "beside" not in noise


def test_the_loader_step_names_the_data_phase_only_for_what_it_covers():
    covers = helpers.loader_step_words(SLOWER, data_ms=20.0, diff_ms=15.0)
    assert covers.endswith("data phase took 20.0 ms: the whole difference")
    part = helpers.loader_step_words(SLOWER, data_ms=5.0, diff_ms=15.0)
    assert part.endswith("the rest this run does not explain")
    assert "does not say why" in helpers.loader_step_words(FASTER, 5.0, -3.0)
    assert "cannot tell from the noise" in helpers.loader_step_words(NOISE, 5.0, 2.0)


def test_the_compute_split_says_off_the_core_only_when_wall_time_exceeds_cpu_time():
    words = helpers.compute_split_words
    off = words(NOISE, FASTER, 400.0, 56.0, 600.0, 112.0)
    assert "on the core its share cost about 1/2" in off
    assert "it spent off its core" in off and "344.0 ms" in off
    assert "one worker alone's wall time exceeded its CPU time by 488.0 ms" in off
    assert "lowest 1.200" in off and "what took it, this run does not say" in off
    assert "time its thread's CPU clock did not count" in off
    assert "threads held" not in off and "descheduled" not in off
    on = words(FASTER, NOISE, 70.0, 65.0, 120.0, 110.0)
    assert "cost more than 1/2 on the core itself" in on
    assert "did not measurably lose its core" in on and "spent off" not in on
    assert "the spread reaches 1" in on
    assert on.endswith("while one worker alone's wall time exceeded its CPU time by 10.0 ms, a "
                      "gap not put to the workers' test")
    # both figures in the same format: a small one-worker figure is not "0.1"
    assert "exceeded its CPU time by 0.06 ms" in words(NOISE, NOISE, 1.0, 1.0, 2.06, 2.0)
    # one worker's gap under the floor is not quoted (no "by 0.00 ms"), whatever the branch
    for off in (NOISE, FASTER, helpers.Ratio([1.001, 1.002, 1.003])):
        quiet = words(NOISE, off, 1.84, 1.80, 2.0, 1.99)
        assert "one worker alone" not in quiet and "0.00 ms" not in quiet, quiet
        assert not quiet.endswith(("while ", "while", "()")), quiet
    assert words(NOISE, FASTER, 1.9, 1.8, 2.0, 1.99).endswith("this run does not say")
    assert "cost less than 1/2" in words(SLOWER, NOISE, 50.0, 45.0, 120.0, 110.0)
    assert words(NOISE, NOISE, 1, 1, 3, 3, k=3).startswith("each of 3 workers")
    # below 10 ms the head prints two decimals, as the chapter's prose does (1.55, not 1.6)
    assert words(NOISE, NOISE, 1.55, 1.5, 2.0, 2.0).startswith(
        "each of 2 workers computed for 1.55 ms a step, against 1/2 of one worker's 2.00 ms, "
        "1.00; on its core (its thread's CPU time) 1.50 ms")
    # a small time off the core is printed, not rounded to "0.0"
    assert "the rest of its compute, 0.06 ms," in words(NOISE, FASTER, 1.86, 1.80, 3.6, 3.6)
    # above 1 in every round, but under the floors: not said to have lost its core
    for tiny, ratio in ((words(NOISE, FASTER, 1.84, 1.80, 3.6, 3.6), "1.200"),
                        (words(NOISE, helpers.Ratio([1.001, 1.002, 1.003]), 1.55, 1.4, 3, 3),
                         "1.001")):
        assert "did not measurably lose its core" in tiny and "spent off" not in tiny
        assert f"its lowest ratio, {ratio}, " in tiny and "as time off the core, so" in tiny
    assert "exceeded its CPU time by 0.04 ms" in words(NOISE, FASTER, 1.84, 1.80, 3.6, 3.6)
    assert "though its lowest ratio, 1.200, reaches the 1.01 this chapter requires" in words(
        NOISE, FASTER, 1.84, 1.80, 3.6, 3.6)
    assert "and its lowest ratio, 1.001, is under the 1.01" in words(
        NOISE, helpers.Ratio([1.001, 1.002, 1.003]), 1.52, 1.5, 3, 3)


def test_the_compute_split_names_the_test_that_decided_and_prints_the_low_end_apart():
    # a batch-256 run whose gap passes the floor: 0.8 ms, 16 times it, but the lowest ratio
    # 1.008 under 1.01: the sentence must say that the ratio decided, and not print 1.01
    ratio = helpers.Ratio([1.0, 1.008, 1.01, 1.01, 1.01, 1.01, 1.02, 1.02, 1.06, 1.1])
    got = helpers.compute_split_words(NOISE, ratio, 40.2, 39.4, 79.6, 77.1)
    assert ("its wall time exceeded its CPU time by 0.8 ms (wall time / CPU time 1.01x "
            "(1.008-1.06, 10 rounds)): above the 0.05 ms floor, but its lowest ratio, 1.008, "
            "is under the 1.01 this chapter requires to count it as time off the core, so it "
            "did not measurably lose its core") in got
    assert "under the 0.05 ms or the 1%" not in got


def test_the_allreduce_split_compares_the_time_after_the_last_arrival_with_it_alone():
    alone = helpers.Measurement([0.4e-3, 0.5e-3, 0.6e-3])
    longer = helpers.allreduce_split_words(12.9, 0.4, 11.1, alone)
    assert "rank 0 waited 0.40 ms for the other worker to arrive" in longer
    assert "11.10 ms passed after both had arrived" in longer
    assert longer.endswith("this run does not say")
    wide = helpers.allreduce_split_words(1.0, 0.5, 0.5, alone)
    assert "too wide for this run to tell" in wide and "as long as alone" not in wide
    assert "no longer than alone" in helpers.allreduce_split_words(1.0, 0.7, 0.3, alone)


def test_overlap_lengthening_is_blamed_on_the_shared_core_only_when_compute_grew():
    words = helpers.overlap_lengthens_words
    grew = words(SLOWER, SLOWER)
    assert grew.startswith("overlap lengthened the step here. Backward's compute itself was "
                           "longer with overlap")
    assert "one possible cause, not timed here, is gloo's threads" in grew
    assert "hooks' copies" not in grew and "suspect" not in grew
    assert "count as compute in both modes" in grew   # booked alike: not a cause
    unexplained = words(SLOWER, NOISE)
    assert unexplained.startswith("overlap lengthened the step here, and why, this run does not "
                                  "say. Backward's compute")
    assert "gloo" not in unexplained
    assert words(FASTER, NOISE) == "overlap shortened the step here"
    assert words(FASTER, SLOWER).startswith("overlap shortened the step here. Backward's compute "
                                            "itself was longer")
    assert words(NOISE, NOISE).startswith("this run cannot tell whether overlap lengthened or "
                                          "shortened the step here. Backward's compute")
    assert "could not be told from its compute without" in words(NOISE, NOISE)
    assert "compute was shorter with overlap" in words(NOISE, FASTER)


def test_alone_predictions_say_inside_cannot_tell_above_or_below_each_spread():
    """The lone timing's spread makes the prediction a range, and a miss
    names the measured parts of the gap, largest first, each only where measured."""
    words = helpers.alone_prediction_words
    parts = [("waiting for the other worker", 0.16), ("compute lost", 0.53),
             ("all-reduce after both had arrived, above its lone median", 1.86),
             ("nothing", 0.01)]
    got = words([("batch 256", 2.0, (1.9, 2.1), FASTER, parts),
                 ("batch 4", 1.1, (1.0, 1.2), NOISE, [])])
    assert got.startswith("2.00 times at batch 256 (1.90-2.10 from the lone timing's spread), "
                          "above the measured 1.20-1.40: two workers did worse than the lone "
                          "timing predicts; the step was longer than predicted by 1.86 ms of "
                          "all-reduce after both had arrived, above its lone median, then 0.53 ms "
                          "of compute lost, then 0.16 ms of waiting for the other worker "
                          "(medians, in order of size)")
    assert "nothing" not in got, "a part under the floor is not named"
    assert got.endswith("; and 1.10 times at batch 4 (1.00-1.20 from the lone timing's spread), "
                        "inside the measured 0.90-1.30")
    unnamed = words([("b", 2.0, (1.9, 2.1), FASTER, [("compute lost", -0.2)])])
    assert "this run does not say" in unnamed and "compute lost" not in unnamed
    # a prediction whose range overlaps the measurement: 1.37 predicted, 0.50-1.50 from the
    # spread, 0.46-0.70
    overlap = words([("batch 4", 1.37, (0.50, 1.50), helpers.Ratio([0.46, 0.6, 0.70]), parts)])
    assert overlap == ("1.37 times at batch 4 (0.50-1.50 from the lone timing's spread), a range "
                       "that overlaps the measured 0.46-0.70: this run cannot tell the "
                       "prediction from the measurement")
    below = words([("batch 4", 0.5, (0.4, 0.6), SLOWER, parts)])
    assert below.startswith("0.50 times at batch 4 (0.40-0.60 from the lone timing's spread), "
                            "below the measured 0.70-0.90: two workers did better than the lone "
                            "timing predicts")
    assert below.endswith("this run does not say") and "waiting" not in below
    assert words([("b", 1.3, (1.3, 1.3), FASTER, [])]) == (
        "1.30 times at b (1.30-1.30 from the lone timing's spread), inside the measured "
        "1.20-1.40")
    with pytest.raises(ValueError, match="at least one"):
        words([])
    with pytest.raises(ValueError, match="outside its range"):
        words([("b", 1.3, (1.4, 1.5), FASTER, [])])


def test_the_thesis_claims_only_what_was_resolved():
    assert helpers.thesis_words(FASTER, {"one message": SLOWER, "8 messages": SLOWER}) == (
        "every small-batch run showed the loss; the large batch showed the win")
    only = helpers.thesis_words(NOISE, {"one message": NOISE, "8 messages": SLOWER})
    assert only == ("only the run with 8 messages showed the loss (one message: within noise); "
                    "the large batch did not resolve the win (within noise)")
    none = helpers.thesis_words(SLOWER, {"one message": NOISE, "8 messages": FASTER})
    assert none.startswith("no small-batch run") and "contradicted" in none


def test_a_split_prediction_says_inside_or_outside_and_points_to_the_split_only_on_a_miss():
    words = helpers.split_prediction_words
    inside = words(1.1, NOISE, "the split below")
    assert inside == "1.10 times, inside the measured 0.90-1.30"
    over = words(1.5, FASTER, "the split below")
    assert over == ("1.50 times, outside the measured 1.20-1.40: the measured speed-up was "
                    "lower, and the split below shows where the time went")
    assert "speed-up was higher" in words(0.6, SLOWER, "the lines above")
    with pytest.raises(TypeError, match="helpers.Ratio"):
        words(1.1, 1.2, "x")


def test_a_prediction_just_outside_the_spread_is_printed_apart_from_its_end():
    words = helpers.split_prediction_words
    # 136.72 / (136.72 / 2 + 10.40) = 1.736 against a low end of 1.7406: at two decimals both
    # read 1.74, and "1.74, outside 1.74-2.19" would contradict itself
    near = words(136.72 / (136.72 / 2 + 10.40), helpers.Ratio([1.7406, 1.9, 2.19]), "the split")
    assert near.startswith("1.736 times, outside the measured 1.741-2.19: the measured "
                           "speed-up was higher")
    # the same at the high end, and to as many decimals as it takes
    high = words(1.40049, helpers.Ratio([1.2, 1.3, 1.4004]), "the split")
    assert high.startswith("1.4005 times, outside the measured 1.20-1.4004: the measured "
                           "speed-up was lower")
    # two decimals tell them apart: two decimals are printed
    assert words(1.736, helpers.Ratio([1.76, 1.9, 2.19]), "x").startswith(
        "1.74 times, outside the measured 1.76-2.19")


def test_backward_compute_blames_gloos_threads_only_for_a_longer_compute():
    words = helpers.backward_compute_words
    assert words(SLOWER).startswith("longer with overlap (overlap's took 1.25 times as long "
                                    "(1.11-1.43, 3 rounds): resolved)")
    assert "; one possible cause, not timed here, is gloo's threads" in words(SLOWER)
    assert "if the difference is real" not in words(SLOWER)
    longer = words(helpers.Ratio([0.5, 0.9, 1.2]))      # overlap's longer, not resolved
    assert longer.startswith("not told apart")
    assert "; if the difference is real, one possible cause" in longer
    assert words(NOISE) == ("not told apart (overlap's took 0.91 times as long (0.77-1.11, "
                            "3 rounds): within noise)")
    shorter = words(FASTER)
    assert "does not explain" in shorter and "gloo" not in shorter


def test_the_emulation_keeps_its_shape_within_its_margin():
    words = helpers.emulation_margin_words
    within = words(2000, 420.0, {"overlap": 30.0, "after": 5.0})
    assert "lasts 2,000 times as long" in within and "by more than 420 ms" in within
    assert within.endswith("ended 30.0 ms after the modelled schedule and the other 5.0 ms, "
                           "within it")
    beyond = words(2000, 420.0, {"overlap": 500.0, "after": 5.0})
    assert "beyond it" in beyond and "machine's delays" in beyond
    with pytest.raises(ValueError, match="saving"):
        words(2000, 0.0, {"overlap": 0.0, "after": 0.0})


def test_bucket_launches_are_placed_against_the_last_autograd_node():
    words = helpers.bucket_launch_words
    assert words(4, 4, 4) == ("DDP launched 4 bucket all-reduces, all of them before backward's "
                              "last autograd node started, while autograd still had gradients "
                              "to compute")
    inside = words(24, 24, 21)
    assert inside.startswith("DDP launched 24 bucket all-reduces, all before backward's last "
                             "autograd node ended: 21 before it started")
    assert inside.endswith("and 3 from inside that last node, once its own gradient was in")
    after = words(5, 4, 3)
    assert after.endswith("3 before backward's last autograd node started, 1 from inside it, "
                          "by its gradient's hook, and 1 later, in the reducer's wait")
    assert words(1, 1, 1).startswith("DDP launched 1 bucket all-reduce,")
    with pytest.raises(ValueError, match="before_last"):
        words(3, 2, 3)


def test_a_trace_says_where_its_all_reduce_fell_against_backward():
    words = helpers.trace_region_words
    split = dict(total=50.0, outside=0.0, late=0.0, windows=55.0, clock="host")
    inside = words(split)
    assert inside == ('All of it falls inside the region "backward" (55.0 ms in all), each '
                      "all-reduce in the one it began in: under DDP `backward()` returns only "
                      "once the reducer has waited for every bucket's all-reduce")
    late = words(dict(split, outside=1.0, late=1.0))
    assert late.startswith('All but 1.0 ms of it falls inside the region "backward" (55.0 ms in '
                           "all), each all-reduce in the one it began in: 1.0 ms ran on after "
                           "`backward()` had returned, in all-reduces that began inside it. "
                           "Gloo marks")
    # a late piece that ran into the next step's backward is said, and not as its overlap
    stale = words(dict(split, outside=1.0, late=1.0, stale=0.3))
    assert ("1.0 ms ran on after `backward()` had returned, in all-reduces that began inside "
            "it, 0.3 ms of them on into a later step's backward, where they count as neither "
            "its overlap nor its wait. Gloo marks") in stale
    with pytest.raises(ValueError, match="stale"):
        words(dict(split, outside=1.0, late=0.5, stale=0.6))
    assert "the trace does not show" in late, "what held the records open is not measured"
    assert late.endswith("Those 1.0 ms are counted below neither as overlapped nor as exposed: "
                         "`backward()` did not wait for them")
    other = words(dict(split, outside=0.004, late=0.0))
    assert "0.004 ms in all-reduces that began outside every backward, which this run does " \
           "not explain" in other and "Gloo marks" not in other and "ran on" not in other
    both = words(dict(split, outside=0.3, late=0.1))
    assert "0.1 ms ran on after" in both and "; and 0.2 ms in all-reduces that began" in both
    gpu = words(dict(split, clock="gpu"))
    assert gpu == ("All of it falls inside backward's windows on the GPU, from its first kernel "
                   "to the end of the all-reduce kernels it launched (55.0 ms in all), each "
                   "all-reduce in the one it began in")
    gpu_late = words(dict(split, clock="gpu", outside=0.5, late=0.5))
    assert "after its window had ended" in gpu_late and "does not explain" in gpu_late
    assert "Gloo" not in gpu_late
    with pytest.raises(ValueError, match="late"):
        words(dict(split, outside=1.0, late=2.0))
    with pytest.raises(ValueError, match="total"):
        words(dict(split, outside=60.0, late=0.0))


def test_the_reducer_wait_is_said_apart_where_no_all_reduce_ran_in_it():
    """A wait with no all-reduce record open is not called communication."""
    words = helpers.reducer_wait_words
    full = words(dict(wait=20.7, wait_busy=20.7, wait_idle=0.0, exposed=20.7))
    assert full.startswith("The purple reducer-wait regions, 20.7 ms in all, had an all-reduce "
                           "running throughout: that exposed time, not the all-reduce's total, "
                           "is what the communication adds to a step")
    part = words(dict(wait=20.7, wait_busy=13.2, wait_idle=7.5, exposed=13.2))
    assert part.startswith("The purple reducer-wait regions, 20.7 ms in all, were not all "
                           "communication: an all-reduce ran in 13.2 ms of them, the exposed "
                           "time; in the other 7.5 ms `backward()` waited with no all-reduce "
                           "running in the trace")
    assert "this trace does not attribute it" in part and "The step lost the whole wait" in part
    assert "throughout" not in part
    stale = words(dict(wait=20.7, wait_busy=14.0, wait_idle=6.7, exposed=13.2))
    assert "(the exposed 13.2 ms, and 0.8 ms of an earlier step's all-reduce still open)" in stale
    # under the floor the idle part is not said apart
    assert "throughout" in words(dict(wait=20.7, wait_busy=20.68, wait_idle=0.02, exposed=20.6))
    none = words(dict(wait=3.0, wait_busy=0.0, wait_idle=3.0, exposed=0.0))
    assert none.startswith("The purple reducer-wait regions, 3.0 ms in all, had no all-reduce "
                           "running in them") and "not show them as communication" in none
    assert "adds to a step" not in none
    with pytest.raises(ValueError, match="wait_busy"):
        words(dict(wait=20.7, wait_busy=13.2, wait_idle=5.0, exposed=13.2))
    with pytest.raises(ValueError, match="exposed"):
        words(dict(wait=20.7, wait_busy=13.2, wait_idle=7.5, exposed=14.0))
