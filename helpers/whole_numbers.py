"""The one rule for a count (ranks, devices, micro-batches, repeats): a whole number >= 1,
TypeError for another kind of value, ValueError for one below 1, each naming the fix. It imports
nothing of helpers, so devices, which validate itself builds on, checks its counts by it too;
everything else takes it from validate."""
import numbers

__all__ = ["validate_positive_int"]


def validate_positive_int(value, name, allow_none=False, fix=""):
    """`value` must be an int >= 1 (None too if `allow_none`); returns it. `fix`, when given,
    ends both errors' messages (what the count is, a call that works)."""
    end = f": {fix}" if fix else ""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = (f": pass {name}={int(value)}" if isinstance(value, float) and value.is_integer()
                and value >= 1 else end)
        raise TypeError(f"{name} must be a whole number (int), got {value!r} "
                        f"({type(value).__name__}){hint}")
    if value < 1:
        none = " or None (all of it)" if allow_none else ""
        raise ValueError(f"{name} must be at least 1{none}, got {value}{end}")
    return int(value)
