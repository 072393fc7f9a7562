"""The build's small scripts: the no-execution book config (make test-book) and the stored-output
writer (make outputs: default size, no stderr, no stored error)."""
import importlib.util
import pathlib

import nbformat
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_book_config_turns_execution_off_and_keeps_extensions_found(tmp_path):
    mod = _load("book_config")
    out = tmp_path / "cfg" / "_config.test.yml"
    mod.main(["--execute", "off", "--out", str(out)])
    cfg = yaml.safe_load(out.read_text())
    orig = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["execute"]["execute_notebooks"] == "off"
    assert orig["execute"]["execute_notebooks"] == "force", "make book keeps executing"
    for name, path in cfg["sphinx"]["local_extensions"].items():
        assert pathlib.Path(path).is_absolute() and (pathlib.Path(path) / f"{name}.py").is_file()
    assert {k: v for k, v in cfg.items() if k not in ("execute", "sphinx")} == \
        {k: v for k, v in orig.items() if k not in ("execute", "sphinx")}
    with pytest.raises(SystemExit, match="one of"):
        mod.main(["--execute", "sometimes", "--out", str(out)])


def _nb():
    nb = nbformat.v4.new_notebook()
    ok = nbformat.v4.new_code_cell("print(1)")
    ok.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                  nbformat.v4.new_output("stream", name="stderr", text="UserWarning: x\n")]
    nb.cells = [ok]
    return nb


def test_outputs_lose_stderr_and_errors_are_refused():
    mod = _load("execute_notebooks")
    nb = _nb()
    assert mod.clean(nb) == []
    assert [o["name"] for o in nb.cells[0].outputs] == ["stdout"], "stderr must be dropped"
    shown = nbformat.v4.new_code_cell("helpers.launch(...)")      # its progress line, emptied
    shown.outputs = [nbformat.v4.new_output("stream", name="stdout", text="2 ranks\n"),
                     nbformat.v4.new_output("display_data", data={"text/plain": ""}),
                     nbformat.v4.new_output("display_data", data={"text/plain": "a figure"})]
    nb.cells = [shown]
    assert mod.clean(nb) == []
    assert [o.get("name") or o["data"]["text/plain"] for o in shown.outputs] == \
        ["stdout", "a figure"], "an emptied display is dropped, nothing else"
    bad = _nb()
    err = nbformat.v4.new_code_cell("1/0")
    err.outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by "
                                          "zero", traceback=[])]
    meant = nbformat.v4.new_code_cell("raise ValueError('shown on purpose')",
                                      metadata={"tags": ["raises-exception"]})
    meant.outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])]
    bad.cells += [err, meant]
    problems = mod.clean(bad)
    assert len(problems) == 1 and "ZeroDivisionError" in problems[0]


def test_outputs_refuse_quick_mode(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    with pytest.raises(SystemExit, match="default size"):
        _load("execute_notebooks").main([])
    assert "env -u COURSE_QUICK" in (ROOT / "Makefile").read_text()


def test_scripts_write_text_whole_or_not_at_all(tmp_path):
    """text_files.write_text_atomic (the scripts that run without torch): the new text or the
    old file, never a part, and no temporary file left either way."""
    mod = _load("text_files")
    out = tmp_path / "lock.txt"
    mod.write_text_atomic(out, "old\n")
    with pytest.raises(UnicodeEncodeError):
        mod.write_text_atomic(out, "new\n\ud800")     # fails while writing: no UTF-8 for it
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["lock.txt"]
    mod.write_text_atomic(out, "new\n")
    assert out.read_text() == "new\n" and len(list(tmp_path.iterdir())) == 1
