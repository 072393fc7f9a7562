"""Where the course's own modules bind the references a check blocks (stubs._patch), found
without reading every function of every course module on each answer call. Each module's walk
is kept (a plan): its names and values, the type of each, and the identity of each plain
function's code. A plan is reused only while provably current, compared by identity in C (its
builtins bound at import, no code of the reader's run): the module under its name in
sys.modules, its namespace the very names and values in order, each value's type the same, each
plain function's `__dict__` still empty, and no `__code__` written since (stubs.py's audit hook
counts every write but the harness's own swaps; a function stubbed now is read afresh). Any
other value is read as the full walk reads it, every call; after such a read or a swap (code
may have run) what follows is checked again before it is passed over, and if it changed the
rest is the full walk."""
import bisect
import itertools
import operator
import types

from .references import _COURSE, code_key, identity

__all__ = ["walk"]

_MODULES = {"names": (), "course": (), "table": None}   # sys.modules as last seen
_PLANS = {}          # id(module) -> plan of a course module (holds the module: ids stay unique)
# non-callable types whose instances the walk passes over without running any code
_PLAIN = frozenset(map(id, (str, bytes, int, float, bool, complex, type(None), tuple, list,
                            dict, set, frozenset, range, slice, bytearray, types.ModuleType)))


def _same(saved, now, _is=operator.is_, _all=all, _map=map):
    """Whether `now` yields the very objects `saved` holds, in order (identity, in C)."""
    return _all(_map(_is, saved, now))


def _course_table(table, _len=len, _type=type, _str=str, _is=operator.is_, _all=all,
                  _map=map, _repeat=itertools.repeat, *, _MODULES=_MODULES, _PLANS=_PLANS):
    """The course's (name, module) entries of `table` (sys.modules) in order, or None where its
    names are not all plain strings (the full walk then reads them); kept while the table has
    the very names in order and the very objects under the course's."""
    if _type(table) is not dict:
        return None
    try:
        if (_MODULES["table"] is table and _len(table) == _len(_MODULES["names"])
                and _same(_MODULES["names"], table) and _same(
                    _MODULES["values"], _map(table.get, _MODULES["keys"]))):
            return _MODULES["course"]
    except RuntimeError:        # another thread's import changed the table while it was read
        return None
    names = tuple(table)
    if not _all(_map(_is, _map(_type, names), _repeat(_str))):
        return None
    keys = tuple(n for n in names if n.split(".")[0] in _COURSE and ".checks" not in n)
    values = tuple(map(table.get, keys))
    _MODULES.update(table=table, names=names, keys=keys, values=values,
                    course=tuple((n, m) for n, m in zip(keys, values, strict=True)
                                 if m is not None))
    kept = {id(m) for _, m in _MODULES["course"]}
    for gone in [k for k in list(_PLANS) if k not in kept]:    # (ranks may run this at once:
        _PLANS.pop(gone, None)                                  # a copy, and pop)
    return _MODULES["course"]


class _Plan:
    """One course module's walk: its namespace, each value's type, the plain functions (their
    positions and code's identity), the positions read afresh every call."""
    __slots__ = ("module", "names", "values", "types", "writes", "fn_at", "fns", "idents",
                 "by_ident", "by_fn", "live", "quiet")

    def __init__(self, module, items, writes, swapped):
        self.module, self.writes = module, writes
        self.names = tuple(k for k, _ in items)
        self.values = tuple(v for _, v in items)
        self.types = tuple(map(type, self.values))
        self.fn_at, self.live, self.idents, self.by_ident, self.by_fn = [], [], {}, {}, {}
        self.quiet = {}         # id(class) -> (class, its MRO) of the quiet values' classes
        for at, (value, kind) in enumerate(zip(self.values, self.types, strict=True)):
            if issubclass(kind, type) or id(kind) in _PLAIN:
                continue                 # a class, or no callable: passed over
            if kind is types.FunctionType and not dict.__len__(value.__dict__):
                entry = swapped.get(id(value))     # stubbed now: its own code is the original
                ident = ("code", code_key(entry[1])) if entry else identity(value)
                self.fn_at.append(at)
                self.idents[at] = ident
                self.by_ident.setdefault(ident, []).append(at)
                self.by_fn.setdefault(id(value), []).append(at)
            elif _quiet(kind, kind.__mro__ if type(kind) is type else None):
                self.quiet[id(kind)] = (kind, kind.__mro__)    # passed over while still quiet
            else:
                self.live.append(at)
        self.fns = tuple(self.values[at] for at in self.fn_at)

    def current(self, lo, hi, writes, verified, _type=type, _any=any, _map=map,
                _len=dict.__len__, _dict=operator.attrgetter("__dict__")):
        """Whether positions lo..hi-1 still hold what the plan read: same types, the plain
        functions still without attributes, no code written since, the quiet values' classes
        still quiet (`verified`: those checked since code last ran)."""
        if writes != self.writes:
            return False
        for key, (kind, mro) in self.quiet.items():
            if key not in verified:
                if not _quiet(kind, mro):
                    return False
                verified.add(key)
        if not _same(self.types[lo:hi], _map(_type, self.values[lo:hi])):
            return False
        a, b = bisect.bisect_left(self.fn_at, lo), bisect.bisect_left(self.fn_at, hi)
        return not _any(_map(_len, _map(_dict, self.fns[a:b])))


def _quiet(kind, mro, _names=("__getattribute__", "__getattr__", "__class__", "__call__"),
           _type=type, _dict=type.__dict__["__dict__"].__get__):
    """Whether instances of the class `kind` (with the MRO `mro`) can be passed over without
    running code: not callable, and `isinstance(value, type)` reads `__class__` in C (no
    `__getattribute__`, `__getattr__` or `__class__` of its own along its MRO); a class of a
    metaclass is not judged. A class's dict can change with no audit event: checked again
    whenever code may have run."""
    if mro is None or _type(kind) is not type or kind.__mro__ is not mro or mro[-1] is not object:
        return False
    for base in mro[:-1]:
        space = _dict(base)
        for name in _names:
            if name in space:
                return False
    return True


def _namespace(module, _type=type, _vars=vars):
    """The module's namespace dict where reading it runs no code (a plain module), else None."""
    return _vars(module) if _type(module) is types.ModuleType else None


def walk(table, keys, visit, hit, known, writes, swapped, *, _PLANS=_PLANS):
    """The full walk's bindings over the course's modules in `table` (sys.modules), by their
    plans where current: `visit(module, attr, value)` is the full step for one binding (it
    fills and clears `known` as it goes), `hit(module, attr, value, ref)` the step for a binding
    found to be `ref`'s; each is True when it stubbed a function (`known` then cleared);
    `writes()` counts the code written, `swapped()` is {id(function): entry} of those stubbed."""
    course = _course_table(table)
    if course is None:
        course = [(n, m) for n, m in list(table.items())
                  if m is not None and n.split(".")[0] in _COURSE and ".checks" not in n]
        _full(course, 0, None, 0, visit)
        return
    trail = []          # (plan, lo, hi) passed over by plans since `known` was last cleared
    verified = set()    # the quiet classes checked since code last ran
    stubbed = [swapped()]   # the functions stubbed now (read again after a swap)
    for index, (_, module) in enumerate(course):
        ns = _namespace(module)
        if ns is None:                  # read as the full walk reads it
            _restore_known(trail, keys, known, stubbed[0])
            trail.clear()
            _full(course, index, None, 0, visit, once=True)
            verified.clear()
            stubbed[0] = swapped()
            continue
        plan, count = _PLANS.get(id(module)), writes()
        if plan is None or plan.module is not module or plan.writes != count or not _holds(
                plan, ns):
            items = list(ns.items())
            plan = _Plan(module, items, count, stubbed[0])
            verified.clear()            # reading the functions' code ran the audit hooks
            if writes() != count:        # code written while it was read: the full walk
                _restore_known(trail, keys, known, stubbed[0])
                _full(course, index, items, 0, visit)
                return
            _PLANS[id(module)] = plan
        stopped = _plan_walk(plan, keys, hit, visit, known, writes, stubbed, trail, verified,
                             swapped)
        if stopped is not None:     # the namespace as read at the module's start: the plan's
            _restore_known(trail, keys, known, stubbed[0])
            _full(course, index, list(zip(plan.names, plan.values, strict=True)), stopped, visit)
            return


def _holds(plan, ns, _len=len, _values=dict.values):
    """Whether the namespace `ns` holds the plan's very names and values, in order."""
    try:
        return _len(ns) == _len(plan.names) and _same(plan.names, ns) and _same(
            plan.values, _values(ns))
    except RuntimeError:        # another thread changed it while it was read
        return False


def _events(plan, keys, ids, after=-1):
    """The positions after `after` to visit: the values read every call, the plain functions
    whose identity is a reference's, and those stubbed or already judged (`ids`)."""
    found = [at for key in keys for at in plan.by_ident.get(key, ())]
    found += [at for fn_id in ids for at in plan.by_fn.get(fn_id, ())]
    if found:
        return sorted({at for at in (*plan.live, *found) if at > after})
    return [at for at in plan.live if at > after]


def _plan_walk(plan, keys, hit, visit, known, writes, holder, trail, verified, swapped):
    """Walk one module by its plan; the position from which the full walk must go on, or None."""
    stubbed, lo = holder[0], 0
    if plan.live or plan.by_ident.keys() & keys.keys() or plan.by_fn.keys() & stubbed.keys() \
            or plan.by_fn.keys() & known.keys():
        pending = _events(plan, keys, itertools.chain(stubbed, known))
    else:
        pending = ()                    # nothing to visit: all passed over if still current
    while pending:
        at = pending.pop(0)
        if not plan.current(lo, at + 1, writes(), verified):
            return lo                   # changed since the plan read it: the full walk
        trail.append((plan, lo, at))
        module, attr, value = plan.module, plan.names[at], plan.values[at]
        seen = len(known)
        if at in plan.idents:           # a plain function: judged as the full walk would
            ref = known.get(id(value), known)
            if ref is known:
                ref = known[id(value)] = keys.get(
                    identity(value) if id(value) in stubbed else plan.idents[at])
            cleared = hit(module, attr, value, ref) if ref is not None else False
        else:
            if type(value) is types.FunctionType:   # judged before as a plain function?
                vid = id(value)
                _restore_known([t for t in trail if vid in t[0].by_fn], keys, known, stubbed,
                               only=vid)
            cleared = visit(module, attr, value)
        verified.clear()                # code may have run: the quiet classes checked again
        lo = at + 1
        if cleared:
            trail.clear()
            stubbed = holder[0] = swapped()
            pending = _events(plan, keys, itertools.chain(stubbed, known), at)
        elif len(known) != seen:
            pending = sorted(set(pending) | set(_events(plan, keys, known, at)))
    if not plan.current(lo, len(plan.values), writes(), verified):
        return lo
    trail.append((plan, lo, len(plan.values)))
    return None


def _restore_known(trail, keys, known, stubbed, only=None):
    """Fill `known` as the full walk would have: the plain functions the plans passed over since
    it was last cleared, by the identity they had then (unchanged until now: checked)."""
    for plan, lo, hi in trail:
        a, b = bisect.bisect_left(plan.fn_at, lo), bisect.bisect_left(plan.fn_at, hi)
        for at in plan.fn_at[a:b]:
            value = plan.values[at]
            if only is not None and id(value) != only:
                continue
            ident = identity(value) if id(value) in stubbed else plan.idents[at]
            known.setdefault(id(value), keys.get(ident))


def _full(course, index, items, start, visit, once=False):
    """The full walk from module `index` (its namespace `items` as read, from `start`)."""
    for module_index in range(index, index + 1 if once else len(course)):
        module = course[module_index][1]
        if items is None or module_index != index:
            items = list(vars(module).items())
        for attr, value in items[start if module_index == index else 0:]:
            visit(module, attr, value)
        items = None


del _MODULES, _PLANS
