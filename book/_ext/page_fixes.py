"""A fix for a console error every page of the book otherwise shows (tests/browser finds it).

Sphinx 7.4 writes inline scripts added by extensions after the builder started twice
(`prepare_writing` re-adds the registry's scripts as filename '' beside the builder's filename
None). sphinx-thebe's inline script declares `const THEBE_JS_URL`, so the second copy throws
"Identifier 'THEBE_JS_URL' has already been declared" on every page. The fix uses Sphinx's
private `_JavaScript` class: requirements pin sphinx exactly (requirements/lock.txt).
The theme's light/dark default needs no code: `html_context: {default_mode: auto}` in _config.yml.
"""


def dedupe_inline_scripts(app, env):
    """Give the builder's inline scripts filename '' so that Sphinx's second copy is a duplicate."""
    builder = app.builder
    files = getattr(builder, "_js_files", None)
    if not files:
        return
    try:
        from sphinx.builders.html._assets import _JavaScript
    except ImportError:   # another Sphinx: nothing to fix here
        return
    fixed = []
    for js in files:
        if isinstance(js, _JavaScript) and js.filename is None:
            js = _JavaScript("", priority=js.priority, **js.attributes)
        if js not in fixed:
            fixed.append(js)
    files[:] = fixed


def setup(app):
    app.connect("env-updated", dedupe_inline_scripts)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
