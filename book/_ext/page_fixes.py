"""A fix for a console error every page of the book otherwise shows (tests/browser finds it).

Sphinx 7.4 writes inline scripts added by extensions after the builder started twice
(`prepare_writing` re-adds the registry's scripts as filename '' beside the builder's filename
None). sphinx-thebe's inline script declares `const THEBE_JS_URL`, so the second copy throws
"Identifier 'THEBE_JS_URL' has already been declared" on every page. The fix uses Sphinx's
private `_JavaScript` class: requirements pin sphinx exactly (requirements/lock.txt).
The theme's light/dark default needs no code: `html_context: {default_mode: auto}` in _config.yml.

Also two accessibility fixes that axe-core reports (tests/browser/test_accessibility.py):
- label-content-name-mismatch (serious): myst-nb 1.4 writes `<summary aria-label="Toggle hidden
  content">` around "Show code cell source", so a screen reader says another name than the one
  shown. The label goes; the visible text names the toggle.
- aria-required-children (critical): docutils 0.21 writes the bibliography as `role="list"` whose
  entries have the deprecated role `doc-biblioentry`, not `listitem`. They become list items.
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


ARIA_FIXES = [('<summary aria-label="Toggle hidden content">', "<summary>"),
              (' role="doc-biblioentry"', ' role="listitem"')]


def aria_fixes(app, pagename, templatename, context, doctree):
    """The two markup fixes above, on the page body Sphinx is about to write."""
    body = context.get("body")
    if body:
        for old, new in ARIA_FIXES:
            body = body.replace(old, new)
        context["body"] = body


def setup(app):
    app.connect("html-page-context", aria_fixes)
    app.connect("env-updated", dedupe_inline_scripts)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
