"""The words of the data-parallel chapters (Parts II to IV): sentences chosen by a run's
numbers, one function per sentence with a branch per case, each branch unit-tested
(tests/test_verdicts*.py), so that no notebook cell decides in untested code what the text says.

verdicts (Part IV's ratios and their shared helpers), scaling_verdicts and scaling_words (the
scaling chapter), profile_verdicts, profile_words and trace_verdicts (the profile chapter),
fixes_verdicts and fixes_words (the fixes chapter), scratch_verdicts (Part II's scratch run),
seed_verdicts, ddp_words and syncbn_words (Part III).
"""
