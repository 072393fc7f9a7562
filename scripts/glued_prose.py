"""Paragraphs with glued numbers as helpers.say() code cells: the text as a format template,
re-filled to 79 columns, its output computed now from the notebook's stored glue values."""
import ast
import copy
import pathlib
import re
import sys
import textwrap

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GLUE = re.compile(r"\{glue(?::text)?\}`([A-Za-z_]\w*)(?::([^`]*))?`")
WIDTH = 79
TITLE = "#@title Text with this run's numbers (double-click to see the code)"
# a say() cell's text, between its opening r""" and its closing """)
SAY_TEXT = re.compile(r'(helpers\.say\(r"""\n)(.*?)(\n"""\))', re.S)


def prose_fields(text):
    """The text as a str.format template: glue roles become {name:fmt}, other braces doubled.
    Returns (template, names used)."""
    names, pieces, last = [], [], 0
    for m in GLUE.finditer(text):
        pieces.append(text[last:m.start()].replace("{", "{{").replace("}", "}}"))
        names.append(m.group(1))
        pieces.append("{" + m.group(1) + (":" + m.group(2) if m.group(2) else "") + "}")
        last = m.end()
    pieces.append(text[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(pieces), names


def rewrap(text, width=WIDTH):
    """Markdown paragraphs and list items re-filled to `width` columns (soft line breaks do not
    change how Markdown renders); tables, math blocks, HTML, headings, quotes and code stay."""
    out, para, indent, first = [], [], "", ""
    fenced = math = False

    def flush():
        nonlocal para
        if para:
            words = " ".join(para).split()
            out.extend(textwrap.wrap(" ".join(words), width=width, initial_indent=first,
                                     subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False))
            para = []

    for line in text.split("\n"):
        s = line.strip()
        if math and not s.startswith("$$"):   # inside a display formula, until its closing $$
            out.append(line)
            math = not s.endswith("$$")
            continue
        if s.startswith(("```", "~~~")):
            flush()
            fenced = not fenced
            out.append(line)
            continue
        if s.startswith("$$"):
            flush()
            if not (len(s) > 2 and s.endswith("$$")):
                math = not math
            out.append(line)
            continue
        if fenced or math or not s or s.startswith(("|", "<", "#", ">", "![")) or \
                line.startswith("    "):
            flush()
            out.append(line)
            continue
        item = re.match(r"^(\s*)([-*+]|\d+[.)])\s+(.*)$", line)
        if item:
            flush()
            first = item.group(1) + item.group(2) + " "
            indent = " " * len(first)
            para = [item.group(3)]
            continue
        if not para:
            first = indent = re.match(r"^(\s*)", line).group(1)
        para.append(s)
    flush()
    return "\n".join(out)


def stored_values(cells):
    """{name: value} from the stored glue outputs of `cells` (myst-nb's scrapbook metadata)."""
    values = {}
    for cell in cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else ():
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:   # display=False glues keep it under myst-nb's (papermill's) prefix
                data = out.get("data", {})
                plain = data.get("text/plain", data.get("application/papermill.record/text/plain"))
                values[name] = _literal("".join(plain or ""))
    return values


def _literal(text):
    """A glued value back from its text/plain repr: numbers, strings, numpy scalars, tensors."""
    text = text.strip()
    m = re.match(r"^(?:np\.\w+|numpy\.\w+|tensor)\((.*?)(?:, dtype=[\w.]+)?\)$", text, re.S)
    if m:
        text = m.group(1)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split_blocks(text):
    """Blank-line separated blocks; a fence, a $$ block or a <details> ... </details> stays one."""
    out, cur, depth = [], [], 0
    fence = math = False
    for line in text.split("\n"):
        s = line.strip()
        if math and not s.startswith("$$"):   # inside a display formula, until its closing $$
            cur.append(line)
            math = not s.endswith("$$")
            continue
        if s.startswith(("```", "~~~")):
            fence = not fence
        elif s.startswith("$$") and not (len(s) > 2 and s.endswith("$$")):
            math = not math
        depth += s.count("<details") - s.count("</details>")
        if re.match(r"^#{1,6} ", line) and not (fence or math or depth):   # a heading: alone
            if cur:
                out.append("\n".join(cur))
            out.append(line)
            cur = []
        elif not s and not (fence or math or depth):
            if cur:
                out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def say_cell(template, names, md_cell, imported):
    from helpers import formatted  # the formatting the kernel will do
    body = rewrap(template)
    lines = [TITLE] + ([] if imported else ["import helpers", ""]) + \
        ['helpers.say(r"""', body, '""")']
    src = "\n".join(lines)
    if any(len(ln) > WIDTH for ln in src.split("\n")):
        src += "  # noqa: E501"   # a table row or a long URL: Markdown cannot wrap it
    meta = copy.deepcopy(md_cell.get("metadata", {}))
    meta["tags"] = list(dict.fromkeys(["remove-input", *meta.get("tags", [])]))
    meta["jupyter"] = {**meta.get("jupyter", {}), "source_hidden": True}
    meta["cellView"] = "form"
    # other course marks stay (a figure's caption cell keeps saying whose caption it is)
    meta["course"] = {**meta.get("course", {}), "prose": True, "glued": sorted(set(names))}
    cell = nbformat.v4.new_code_cell(source=src, metadata=meta)
    if md_cell.get("id"):
        cell["id"] = md_cell["id"]
    return cell, formatted
