"""The sync test itself catches a drifted notebook definition."""
import ast

from test_notebook_sync import _strip_docstrings


def test_strip_docstrings_ignores_docstrings_but_not_code():
    a = ast.parse('def f(x):\n    """doc"""\n    return x + 1').body[0]
    b = ast.parse('def f(x):\n    """other doc"""\n    # a comment\n    return x + 1').body[0]
    c = ast.parse('def f(x):\n    return x + 2').body[0]
    assert _strip_docstrings(a) == _strip_docstrings(b)
    assert _strip_docstrings(a) != _strip_docstrings(c)
