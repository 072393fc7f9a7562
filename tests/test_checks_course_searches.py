"""A search over a course function of a count is refused: microbatches_for_bubble through the
course's bubble_fraction, unequal_bubble of equal stages or interleaved_bubble of one chunk (each
the exercise's bubble under another name; tests/test_checks_hunt.py's `_searched` finds them)."""
from check_cases import parametrize_cases, shortcut

import helpers

USED = "the course's own answer"


@shortcut("check_microbatches_for_bubble", "searches with the course's bubble_fraction", USED)
def microbatches_by_bubble_fraction(p, target):
    m = 1
    while helpers.bubble_fraction(p, m) > target + 1e-12:
        m += 1
    return m


@shortcut("check_microbatches_for_bubble", "searches with the course's unequal_bubble of "
          "equal stages", USED)
def microbatches_by_unequal_bubble(p, target):
    m = 1
    while p > 1 and helpers.unequal_bubble([1.0] * p, [1.0] * p, m) > target + 1e-12:
        m += 1
    return m


@shortcut("check_microbatches_for_bubble", "searches with the course's interleaved_bubble of "
          "one chunk", USED)
def microbatches_by_interleaved_bubble(p, target):
    m = 1
    while helpers.interleaved_bubble(p, m, 1) > target + 1e-12:
        m += 1
    return m


test_case = parametrize_cases(__name__)
