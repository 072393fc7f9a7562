"""An answer that computes a quantity the literature defines another way is told which definition
it used and which one the exercise means (not only "that is another number")."""
from check_cases import parametrize_cases, shortcut


@shortcut("check_microbatches_for_bubble", "Megatron-LM's bubble, (p-1)/m",
          ["(p-1)/m", "idle share of the step"])
def microbatches_megatron_bubble(p, target):
    m = 1
    while (p - 1) / m > target:
        m += 1
    return m


test_case = parametrize_cases(__name__)
