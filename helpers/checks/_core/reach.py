"""What an answer's code can reach: the steps of references.scan's walk, from one object to what
it holds. Every object is read by its exact type and through the getters Python made (a class's
dict from `type`, an instance's from its first class's `__dict__` getter or the collector's
referents), so no `__getattr__`, `__getattribute__`, `__dict__` or `__class__` property of the
reader's runs. A class's members are walked where the class is the reader's (or the course's):
decided by where the functions it holds were compiled and by whether it is found where its
`__module__` and `__qualname__` say, never by what `__module__` claims alone; torch's, numpy's
and the standard library's classes are not walked member by member (their code is not read)."""
import builtins
import collections
import dis
import functools
import gc
import sys
import types
import weakref

from . import bytecode, exits
from .keys import str_keys
from .reader_objects import attr, is_a
from .run import is_reader_code
from .whose import made_by_reader

__all__ = ["children", "expandable", "loads", "readers_class", "CONTAINERS"]

_PACKAGE = __name__.split(".checks.")[0]        # "helpers" (or the fresh copy's name)
_COURSE = frozenset({_PACKAGE, "helpers"})      # the fresh copy guards the notebook's helpers
_ITEMS = 200                                    # items read of one container or one object
_HEAP, _IMMUTABLE = 1 << 9, 1 << 8              # Py_TPFLAGS_HEAPTYPE, Py_TPFLAGS_IMMUTABLETYPE
_REFERENTS = gc.get_referents                   # bound now: the guard watches later lookups
_REFERENT = weakref.ref.__call__                # a weak reference's object, read in C
# read by other steps (their code by `loads`, a class's members by `_class_members`): a
# function's referents include its module's globals, which the walk reads only as code loads them
_NOT_TRAVERSED = (types.FunctionType, types.ModuleType, type)
_FLAGS = type.__dict__["__flags__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_CLASS_DICT = type.__dict__["__dict__"].__get__
_MODULE_OF = type.__dict__["__module__"].__get__
_QUALNAME = type.__dict__["__qualname__"].__get__
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_FUNC = {staticmethod: staticmethod.__dict__["__func__"].__get__,
         classmethod: classmethod.__dict__["__func__"].__get__}
_ACCESSORS = tuple(property.__dict__[n].__get__ for n in ("fget", "fset", "fdel"))
_PARTIAL = tuple(functools.partial.__dict__[n].__get__ for n in ("func", "args", "keywords"))
_BASE_ITEMS = ((dict, dict.items), (list, list.__iter__), (tuple, tuple.__iter__),
               (set, set.__iter__), (frozenset, frozenset.__iter__),
               (collections.deque, collections.deque.__iter__))
# the built-in containers, by exact type: what they hold is all the walk needs of them
CONTAINERS = frozenset({dict, list, tuple, set, frozenset, collections.OrderedDict,
                        collections.defaultdict, collections.deque})


def loads(fn):
    """(name, object) for every global, closure variable, module attribute and import the
    bytecode of `fn` (and of the functions nested in it) loads."""
    globals_ = getattr(fn, "__globals__", {})
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    for code in bytecode.nested(fn.__code__):
        current = importing = None
        for ins in dis.get_instructions(code):
            op, arg = ins.opname, ins.argval
            found = None
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                found = globals_.get(arg, getattr(builtins, arg, None))
            elif op in ("LOAD_DEREF", "LOAD_CLOSURE") and arg in cells:
                found = cells[arg].cell_contents if _cell_filled(cells[arg]) else None
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(current, (types.ModuleType,
                                                                               type)):
                # an exit looked up while the answer runs is the watched one (exits.py)
                found = None if exits.patched(current, arg) else getattr(current, arg, None)
            elif op == "IMPORT_NAME":
                found = importing = sys.modules.get(arg) or sys.modules.get(arg.split(".")[0])
            elif op == "IMPORT_FROM" and isinstance(importing, types.ModuleType):
                found = None if exits.patched(importing, arg) else getattr(importing, arg, None)
                if found is None:
                    found = sys.modules.get(f"{importing.__name__}.{arg}")
            elif op == "POP_TOP":
                importing = None
            current = found
            if found is not None:
                yield arg, found


def expandable(obj, course=True):
    """A function whose code the walk reads: the reader's, or (`course`) the course's helpers'."""
    if not is_a(obj, types.FunctionType):
        return False
    module = obj.__module__
    return made_by_reader(obj.__code__) or (
        course and type(module) is str and module.split(".")[0] in _COURSE)


def _cell_filled(cell):
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def _made_in_python(cls):
    """A class a class statement or `type()` made (what the reader can make), not a C type."""
    flags = _FLAGS(cls)
    return bool(flags & _HEAP) and not flags & _IMMUTABLE


def _functions(member):
    """The functions a class member holds: itself, a static or class method's, a property's
    accessors (read by the base types' own getters)."""
    kind = next((k for k in _FUNC if is_a(member, k)), None)
    if kind is not None:
        return (_FUNC[kind](member),)
    if is_a(member, property):
        return tuple(get(member) for get in _ACCESSORS)
    return (member,)


def _found_where_claimed(cls, module):
    """Whether `cls` is what its module (a library's) holds at its qualified name, read from
    the module's and classes' own dicts (a class defined in a function is not)."""
    qualname = _QUALNAME(cls)
    if type(qualname) is not str:
        return False
    held = sys.modules.get(module)
    place = _MODULE_DICT(held) if is_a(held, types.ModuleType) else None
    for part in qualname.split("."):
        if type(place) is not dict and not is_a(place, types.MappingProxyType):
            return False
        held = place.get(part) if str_keys(place) else None
        place = _CLASS_DICT(held) if is_a(held, type) else None
    return held is cls


def _walked(cls, course=True):
    """Whether the walk reads `cls`'s members: a class made in Python that holds a function of
    the reader's (or the course's), or claims the reader's module, or is not found where its
    `__module__` and `__qualname__` say (a class claiming `json` that `json` does not hold)."""
    if not _made_in_python(cls):
        return False
    for member in list(_CLASS_DICT(cls).values()):   # copied in C: other threads patch classes
        if any(expandable(f) if course else is_a(f, types.FunctionType) and made_by_reader(
                f.__code__) for f in _functions(member)):
            return True
    module = _MODULE_OF(cls)
    if type(module) is not str:
        return True
    where = attr(sys.modules.get(module), "__file__", None)
    if module == "__main__" or is_reader_code(where if type(where) is str else "<"):
        return True
    return not _found_where_claimed(cls, module)


def readers_class(cls):
    """Whether a class of `cls`'s MRO is the reader's (`_walked`, the course's left out)."""
    return any(_walked(c, course=False) for c in _MRO(cls))


def _label(key):
    return key if type(key) is str else "key"


def _class_members(cls, course=True):
    """The members of the classes of `cls`'s MRO that the walk reads (`_walked`), and its
    metaclass, whose methods run on the class's attributes."""
    for c in _MRO(cls):
        if _walked(c, course):
            yield from ((_label(k), v) for k, v in list(_CLASS_DICT(c).items())[:_ITEMS * 2])
    meta = type(cls)
    if _made_in_python(meta):
        yield "metaclass", meta


def _held(obj):
    """What `obj` holds: the items of a built-in container (by the base type's own method); an
    object of a class made in Python, what the collector says it refers to (its attributes and
    slots, its container items); else its instance dict, by its type's own getter, and what the
    collector says it refers to (a slice's bounds, a generator's locals, an exception's args, a
    mapping proxy's mapping, a defaultdict's factory: C code, no reader's)."""
    cls = type(obj)
    base = next(((b, read) for b, read in _BASE_ITEMS if issubclass(cls, b)), None)
    if base is not None and not _made_in_python(cls):
        items = list(base[1](obj))[:_ITEMS]
        if base[0] is dict:     # a key other than a name or a number is held too (`{work: n}`)
            items = [(_label(k), v) for k, v in items] + [
                ("key", k) for k, _ in items if type(k) not in (str, int)]
        else:
            items = [("item", x) for x in items]
        return items + _referents(obj) if cls is collections.defaultdict else items
    if _made_in_python(cls):
        return [("held", x) for x in _REFERENTS(obj)[:_ITEMS] if x is not cls]
    held = []
    getter = next((d["__dict__"] for d in map(_CLASS_DICT, _MRO(cls)) if "__dict__" in d),
                  None)     # a C type's MRO: C types, whose dicts hold only strs
    if type(getter) in (types.GetSetDescriptorType, types.MemberDescriptorType):
        held = getter.__get__(obj, cls)
        if type(held) is dict:
            held = [(_label(k), v) for k, v in list(dict.items(held))[:_ITEMS]]
        else:
            held = []
    return held + ([] if is_a(obj, _NOT_TRAVERSED) else _referents(obj))


def _referents(obj):
    """What the collector says the C object `obj` refers to (its type's tp_traverse, no
    reader's code), less a library module's namespace (the walk stops at a library, as it does
    at its module)."""
    return [("held", x) for x in _REFERENTS(obj)[:_ITEMS] if not _library_namespace(x)]


def _library_namespace(space):
    """Whether `space` is the globals of a module in sys.modules that is not the reader's."""
    if type(space) is not dict or not str_keys(space):
        return False
    name = space.get("__name__")
    module = sys.modules.get(name) if type(name) is str else None
    if not is_a(module, types.ModuleType) or _MODULE_DICT(module) is not space:
        return False
    where = space.get("__file__")
    return name != "__main__" and not is_reader_code(where if type(where) is str else "<")


def children(obj, course=True):
    """What `obj` gives the walk next: (label, child) pairs; without `course`, the code and
    class members of the reader's alone (held.py: what the reader's state holds)."""
    if is_a(obj, functools.partial):
        func, args, keywords = (get(obj) for get in _PARTIAL)
        yield "partial", func
        yield from (("arg", a) for a in (*args, *dict.values(keywords)))
    elif is_a(obj, types.MethodType):
        yield "method", obj.__func__
        if not is_a(obj.__self__, types.ModuleType):
            yield "self", obj.__self__
    elif is_a(obj, types.BuiltinMethodType) and not is_a(obj.__self__, types.ModuleType):
        yield "self", obj.__self__          # a bound method of a dict or an object
    elif is_a(obj, (staticmethod, classmethod, property)):
        yield from (("method", f) for f in _functions(obj) if f is not None)
    if is_a(obj, type):
        yield from _class_members(obj, course)
        return
    if _made_in_python(type(obj)):
        yield "class", type(obj)
    else:
        wrapped = attr(obj, "__wrapped__", None)
        if wrapped is not None:
            yield "wrapped", wrapped
    if is_a(obj, weakref.ReferenceType):    # (the collector does not say what it refers to)
        yield "referent", _REFERENT(obj)
    yield from _held(obj)
    if expandable(obj, course):
        yield from loads(obj)
        yield from (("closure", c.cell_contents) for c in (obj.__closure__ or ())
                    if _cell_filled(c))
        yield from (("default", d) for d in (obj.__defaults__ or ()))
        yield from (("default", d) for d in list((obj.__kwdefaults__ or {}).values()))
