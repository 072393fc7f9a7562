"""The course's answer copied at run time out of its source file: one `def` taken from the
module's AST and exec'd. CPython compiles it apart from its module (LOAD_METHOD for LOAD_ATTR,
other jump offsets), so the references' code identity must not depend on that; refused."""
import ast
import importlib

from check_cases import parametrize_cases, shortcut


@shortcut("check_zigzag_positions", "the course's split_positions copied from its file and "
          "exec'd", "a copy of")
def zigzag_positions_copied(T, world, rank):
    mod = importlib.import_module("helpers.context_" + "parallel.scratch")
    with open(mod.__file__) as f:
        tree = ast.parse(f.read())
    name = "split_" + "positions"
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name][0]
    ns = {"torch": mod.torch, "LAYOUTS": mod.LAYOUTS}
    exec(compile(ast.Module([fn], []), "<copy>", "exec"), ns)
    return ns[name](T, world, rank)


test_case = parametrize_cases(__name__)
