"""A code object's instructions, independent of its compilation unit: CPython compiles
`module.f(...)` as LOAD_ATTR in one module and LOAD_METHOD in another (a `def` copied out of
its file), which also moves jump offsets; both are normalised so such a copy keys the same."""
import dis

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
