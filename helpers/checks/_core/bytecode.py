"""A code object's instructions, independent of its compilation unit: CPython compiles
`module.f(...)` as LOAD_ATTR in one module and LOAD_METHOD in another (a `def` copied out of
its file), which also moves jump offsets; both are normalised so such a copy keys the same."""
import dis
import types

from .run import is_reader_code

__all__ = ["instructions", "one_statement", "written_formula", "nested", "const_key"]

_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_SAME = {"LOAD_METHOD": "LOAD_ATTR"}


def instructions(code):
    """(operation, argument) per instruction: LOAD_METHOD read as LOAD_ATTR, a name by its
    name, a jump by the index of the instruction it lands on."""
    found = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(found)}
    out = []
    for ins in found:
        if ins.opcode in _JUMPS:
            arg = index.get(ins.argval, ins.argval)
        elif ins.opcode in dis.hasname:
            arg = ins.argval
        else:
            arg = ins.arg
        out.append((_SAME.get(ins.opname, ins.opname), arg))
    return tuple(out)


def one_statement(fn, package):
    """True for a function whose body is one statement, with no nested code, that calls nothing
    of `package` (a formula over torch: `return (torch.logsumexp(x.float(), -1) ** 2).mean()`).
    A reader who writes that formula writes the course's code: equal code is no sign of a copy
    there (references.scan refuses only the course's function object itself)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or any(
            type(c) is types.CodeType for c in code.co_consts):
        return False
    lines = {line for _, _, line in code.co_lines() if line is not None}
    for name in code.co_names:
        value = fn.__globals__.get(name)
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(
            value, "__module__", None)
        if value is not None and (not isinstance(module, str) or module == package
                                  or module.startswith(package + ".")):
            return False
    return len(lines - {code.co_firstlineno}) <= 1


def written_formula(obj, ref, package):
    """True when `obj`, code equal to the reference `ref`, is a plain function of the reader's
    own file and `ref` a formula (one_statement): the reader wrote it. A compiled, scripted or
    traced copy of the course's function, or the function itself, is not."""
    code = getattr(obj, "__code__", None)
    return (type(obj) is types.FunctionType and obj is not ref and code is not None
            and is_reader_code(code.co_filename) and one_statement(ref, package))


def nested(code):
    """A code object and every code object nested in it (lambdas, inner functions)."""
    yield code
    for const in code.co_consts:
        if type(const) is types.CodeType:   # (not isinstance: it reads a `__class__`)
            yield from nested(const)


_PLAIN = (str, bytes, int, float, complex, bool, type(None), type(Ellipsis))


def const_key(const, code_key):
    """A code object's constant as a key, read by exact type (plain: its repr; a reader's object
    put there by `CodeType.replace`: its identity): none of its methods runs."""
    kind = type(const)
    if kind is types.CodeType:
        return ("code", code_key(const))
    if any(kind is plain for plain in _PLAIN):
        return repr(const)
    if kind is tuple:
        return ("tuple", *(const_key(c, code_key) for c in const))
    if kind is frozenset:
        return ("frozenset", tuple(sorted(repr(const_key(c, code_key)) for c in const)))
    return ("object", id(const))
