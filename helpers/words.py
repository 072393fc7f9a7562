"""Counts and lists with their nouns in agreement ('1 rank', '2 processes', 'ranks 1 and 3'),
for every printed line, error message and sentence of the prose. It imports nothing of helpers,
so any module may use it (devices and config too, which prose itself imports)."""
import numbers

__all__ = ["plural", "plural_names", "how_often"]


def plural(n, word, many=None):
    """'1 rank', '2 ranks', '1 process', '3 processes': a count with its noun in agreement,
    for printed lines and prose (never 'rank(s)'). `many` names an irregular plural."""
    if many is None:   # 'epoch' ends in a hard ch: epochs, as 'stomach'
        hard = word.endswith(("och", "ach")) and not word.endswith(("each", "oach"))
        many = word + ("es" if word.endswith(("s", "x", "ch", "sh")) and not hard else "s")
    whole = isinstance(n, numbers.Integral)   # numpy's and torch's ints too
    return f"{int(n):,} {word if n == 1 else many}" if whole else f"{n} {many}"


def plural_names(items, word, many=None):
    """'rank 3', 'ranks 1 and 3', 'ranks 0, 2 and 5': the noun in agreement with the list it
    names, for messages that say which ranks (never 'rank(s) [1]')."""
    items = [str(i) for i in items]
    noun = plural(len(items), word, many).split(" ", 1)[1]
    if not items:
        return f"no {noun}"
    names = items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
    return f"{noun} {names}"


def how_often(n):
    """'once', '2 times': how many times something happened, for a sentence's verb."""
    return "once" if n == 1 else plural(n, "time")
