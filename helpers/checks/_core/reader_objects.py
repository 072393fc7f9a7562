"""Reading the reader's objects without trusting them, as the scan of an answer's code does:
by their own type (a `__class__` property makes `isinstance` believe any class, and the walk
would skip what the object holds), and with an attribute that computes and fails (a
`__getattr__` raising KeyError) read as absent, so the reader's objects cannot end the check."""
import types

__all__ = ["is_a", "attr", "ROUTINES", "SCALARS"]

# what a walk of the reader's code skips unless callable (a subclass of str may have __call__)
SCALARS = (str, bytes, int, float, bool, type(None))
# functions, methods and C methods: what has no `__call__` of the reader's to read
ROUTINES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
            types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType,
            types.ClassMethodDescriptorType)


def is_a(obj, kinds):
    """`isinstance(obj, kinds)` by `type(obj)`, never by what `obj.__class__` claims."""
    return issubclass(type(obj), kinds)


def attr(obj, name, default=None):
    """`getattr(obj, name, default)`, `default` where reading the attribute raises."""
    try:
        return getattr(obj, name, default)
    except Exception:
        return default
