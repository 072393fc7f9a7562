"""Rewrite the notebooks' MyST prose into markup that reads well wherever a notebook is opened.

Usage: python scripts/reader_markup.py [--check] [--out DIR] [book/x.ipynb ...]
(default: every notebook of _toc.yml, rewritten in place; --out writes copies under DIR instead;
--check changes nothing and exits 1 listing the notebooks a run would change).

Colab, JupyterLab, VS Code and GitHub render Markdown, not MyST: `{glue:text}`, `{term}`, `{cite}`,
`{numref}`, `{doc}` and directives print literally there. Per markdown cell:
- a cell with glued numbers becomes a code cell `helpers.say(r\"\"\"...{name:fmt}...\"\"\")`: it
  displays the paragraph as Markdown with this run's values (helpers/prose.py), its code hidden
  (tag remove-input for the book; `jupyter.source_hidden` for JupyterLab and VS Code; `#@title`
  and `cellView: form` for Colab), its stored output computed now from the values the notebook's
  stored glue outputs hold, so the numbers show before anything runs;
- {term}`x` becomes a link to the glossary entry of the published book, {cite}`k` "[Author et
  al., year]" linking to the bibliography, {doc}`p` a link with the page's title, {numref}`fig`
  "the figure above/below" (a link to the figure on the published page: an in-page `#fig-x` does
  nothing in a notebook); book/_ext/reader_links.py turns links to the published book into links
  within the book being built (checked under -W -n);
- ```{dropdown} T``` becomes <details><summary>T</summary>, ```{note}``` a quoted "**Note.**",
  ```{runs-on} cpu gpu``` the line "*Runs on: CPU, one GPU.*", which book/_ext/course_badges.py
  turns into the badge.
Also, in every notebook (converted or not):
- a relative link to another page of the book (`../part6/mesh2d.ipynb`) becomes the published
  page's address (Colab opens a lone notebook: a relative link is dead there), an in-page link
  (`#fig-zero-owners`: the anchor exists only in the book) the published page's address with
  that anchor (a say() text whose lines grow past 79 columns is re-filled), and a link
  followed by letters (`[bucket](...)s`, a plural) takes them in (`[buckets](...)`);
- the "Runs on" line gets the run time and needs the badge shows in the book, from
  book/_ext/runs.json (chapter_runs.notebook_line; `make outputs` refreshes it);
- the bookkeeping cells the book removes (tag remove-cell: glue, claim) fold like the prose
  cells (`#@title`, `cellView: form`, `jupyter.source_hidden`), without a stored result (a
  claim's `True` under the cell), their outputs hidden too (`jupyter.outputs_hidden`, and
  `collapsed`, which JupyterLab keeps equal to it): a glue's papermill record is for the book,
  and a front end without a renderer for it would say so under the fold;
- "the figure above/below" that starts a sentence is capitalised;
- under each figure, its caption and alt text (the figure cell's myst-nb metadata) in a Markdown
  cell the book removes (scripts/figure_captions.py): a front end shows the image alone.
Idempotent: a converted notebook has nothing left to convert (`--check` converts in memory and
fails where that would change a notebook). Written atomically.
The work is in book_links.py (the links), myst_markdown.py (roles, directives) and
glued_prose.py (the say() cells); this script rewrites whole notebooks with them.
"""
import argparse
import copy
import pathlib
import re
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import book_links as links  # noqa: E402
import glued_prose as glued  # noqa: E402
import myst_markdown as myst  # noqa: E402
from book_files import toc_notebooks  # noqa: E402  (tests/, on the path since book_links)
from figure_captions import is_caption, with_captions  # noqa: E402

BOOKKEEPING = "#@title Bookkeeping for the text below (double-click to see the code)"
SETUP_CELL = "course-setup"   # scripts/colab_setup_cell.py's: folded by that script


def fold_bookkeeping(cell):
    """A cell the book removes (glue, claim): folded under a title, no stored result."""
    meta = cell.metadata
    if "remove-cell" not in meta.get("tags", []) or cell.get("id") == SETUP_CELL:
        return
    if is_caption(cell):          # a caption with a glued value: shown outside the book
        return
    if not cell.source.startswith("#@title"):
        cell.source = BOOKKEEPING + "\n" + cell.source
    meta["cellView"] = "form"
    meta["jupyter"] = {**meta.get("jupyter", {}), "source_hidden": True, "outputs_hidden": True}
    meta["collapsed"] = True      # nbformat's older key for hidden outputs (classic Notebook)
    cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "execute_result"]


def relink_prose(cell, ctx):
    """A say() cell's links, in its text and its stored Markdown, as in a markdown cell."""
    head, say, text = cell.source.partition('helpers.say(r"""')     # its text starts there
    source = links.whole_word_links(links.absolute_links(
        head + say + (links.capital_figures(text) if say else text), ctx, field=True))
    if source != cell.source and any(len(ln) > glued.WIDTH for ln in source.split("\n")):
        # a link made longer: the text re-filled (soft line breaks: Markdown renders it alike)
        source = glued.SAY_TEXT.sub(
            lambda m: m.group(1) + glued.rewrap(m.group(2)) + m.group(3), source, 1)
    cell.source = source
    for out in cell.get("outputs", []):
        md = out.get("data", {}).get("text/markdown")
        if md:
            text = "".join(md) if isinstance(md, list) else md
            out["data"]["text/markdown"] = links.capital_figures(
                links.whole_word_links(links.absolute_links(text, ctx)))


def convert(nb, path, cfg=None):
    """The notebook with its prose rewritten (a new object) and the problems found."""
    ctx = links.Context(path, cfg)
    nb = copy.deepcopy(nb)
    ran = {c.get("id"): c for c in nb.cells if c.cell_type == "code" and is_caption(c)}
    nb.cells = with_captions(nb.cells)
    gpus = (nb.metadata.get("course") or {}).get("gpus")
    ctx.gpus = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None
    figures = {c.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name"): i
               for i, c in enumerate(nb.cells)}
    figures.pop(None, None)
    imported = False
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if re.search(r"^\s*(import helpers|from helpers)", cell.source, re.M):
                imported = True
            fold_bookkeeping(cell)
            if cell.get("metadata", {}).get("course", {}).get("prose"):
                relink_prose(cell, ctx)
            cells.append(cell)
            continue
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        text = myst.blocks(cell.source, ctx)
        text = myst.inline(text, ctx, figures, i)
        text = links.whole_word_links(links.absolute_links(text, ctx))
        text = links.capital_figures(myst.runs_line(text, ctx))
        groups = []   # consecutive blocks with glue / without, in order
        for block in glued.split_blocks(text):
            has = bool(glued.GLUE.search(block)) and not block.lstrip().startswith("#")
            if groups and groups[-1][0] == has:
                groups[-1][1].append(block)
            else:
                groups.append((has, [block]))
        for n, (has, group) in enumerate(groups):
            part = "\n\n".join(group)
            base_id = cell.get("id") or f"cell{i}"
            part_id = base_id if n == 0 else f"{base_id}-{n}"[:64]
            if not has:
                md = copy.deepcopy(cell)
                md.source = part
                md["id"] = part_id
                cells.append(md)
                continue
            template, names = glued.prose_fields(part)
            template = links.book_field(template)
            new, formatted = glued.say_cell(template, names, cell, imported)
            new["id"] = part_id
            values = glued.stored_values(nb.cells[:i])
            missing = [nm for nm in names if nm not in values]
            later = glued.stored_values(nb.cells[i:])
            early = [nm for nm in missing if nm in later]
            if early:
                ctx.problems.append(f"cell {i} ({cell.get('id')}): uses {early} before the cell "
                                    "that glues them: move the glue up, or the text down")
            if not missing:
                md_text = formatted(glued.rewrap(template).strip("\n"), values)
                new.outputs = [nbformat.v4.new_output(
                    "display_data", data={"text/markdown": md_text, "text/plain":
                                          "<IPython.core.display.Markdown object>"})]
            elif not early:
                ctx.problems.append(f"cell {i} ({cell.get('id')}): no stored value for "
                                    f"{missing} (run `make outputs` first, then convert)")
            cells.append(new)
    nb.cells = [_keep_run(c, ran.get(c.get("id"))) for c in cells]
    return nb, ctx.problems


def _keep_run(cell, old):
    """A caption's say cell rebuilt from the metadata keeps the run it had where its text is
    the same (nbval refuses a cell with outputs but no execution count)."""
    if old is None or cell.cell_type != "code" or cell.source != old.source:
        return cell
    cell.outputs, cell.execution_count = old.outputs, old.execution_count
    if "execution" in old.metadata:
        cell.metadata["execution"] = old.metadata["execution"]
    return cell


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, help="write converted copies under this folder")
    args = ap.parse_args(argv)
    from helpers import atomic_write  # a kill leaves the old notebook whole
    cfg = links.config()
    bad, problems_all = [], []
    for path in args.notebooks or toc_notebooks():
        path = pathlib.Path(path).resolve()
        nb = nbformat.read(path, as_version=4)
        if args.check:
            left = myst.raw_markup(nb)
            if left:
                bad.append(f"{path}: {len(left)} lines of MyST, e.g. {left[0]}")
                continue
            new, _ = convert(nb, path, cfg)
            changed = [i for i, (a, b) in enumerate(zip(nb.cells, new.cells)) if a != b]
            if changed or len(nb.cells) != len(new.cells):
                bad.append(f"{path}: a run would change cell {(changed or [len(nb.cells)])[0]}")
            continue
        new, problems = convert(nb, path, cfg)
        problems_all += [f"{path.relative_to(ROOT)}: {p}" for p in problems]
        nbformat.validate(new)
        dest = (args.out / path.relative_to(ROOT)) if args.out else path
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, lambda f, nb=new: nbformat.write(nb, f), mode="w")
    if bad:
        print("not converted (run scripts/reader_markup.py):", *bad, sep="\n  ")
        return 1
    if problems_all:
        print("converted, with problems to fix by hand:", *problems_all, sep="\n  ")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
