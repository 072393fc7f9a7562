"""Each figure's caption and alt text as a Markdown cell under it, for a notebook read outside the
book (Colab, JupyterLab, VS Code, GitHub show the image output alone: no caption, no alt text).

The book shows both from the figure cell's metadata (myst-nb: mystnb.figure.caption,
mystnb.image.alt) and removes this cell (tag remove-cell). scripts/reader_markup.py calls
with_captions first, so a caption's MyST ({glue:text}, {term}) is converted like any prose, and
again on every run: the cells are rebuilt from the metadata, never edited by hand."""
import copy
import textwrap

import nbformat

MARK = "figure_caption"   # metadata course.<MARK>: the id of the figure cell it describes
WIDTH = 79                # as the converted prose (scripts/reader_markup.py)


def caption_text(meta):
    """'**Figure.** caption\\n\\n*The image:* alt.' from a cell's mystnb metadata; None without
    a caption or alt text."""
    mystnb = meta.get("mystnb", {}) if isinstance(meta, dict) else {}
    caption = (mystnb.get("figure", {}).get("caption") or "").strip()
    alt = (mystnb.get("image", {}).get("alt") or "").strip()
    if not (caption or alt):
        return None
    parts = [f"**Figure.** {caption}"] if caption else []
    if alt:
        parts.append(f"*The image:* {alt}{'' if alt.endswith(('.', '!', '?')) else '.'}")
    return "\n\n".join(textwrap.fill(p, WIDTH, break_long_words=False, break_on_hyphens=False)
                       for p in parts)


def is_caption(cell):
    return bool(cell.get("metadata", {}).get("course", {}).get(MARK))


def _bookkeeping(cell):
    """A glue or claim cell the book removes, folded outside it (reader_markup.fold_bookkeeping)."""
    return cell.cell_type == "code" and "remove-cell" in cell.get("metadata", {}).get("tags", [])


def with_captions(cells):
    """`cells` without their caption cells, and a fresh one under each figure cell, after the
    bookkeeping cells right under it (they glue what a caption may show; folded, they hide
    nothing between the image and its caption)."""
    out, pending = [], None
    for i, cell in enumerate(cells):
        if is_caption(cell):
            continue
        if pending is not None and not _bookkeeping(cell):
            out.append(pending)
            pending = None
        out.append(cell)
        text = caption_text(cell.get("metadata", {})) if cell.cell_type == "code" else None
        if text is not None:
            if pending is not None:
                out.insert(len(out) - 1, pending)
            fig_id = cell.get("id") or f"cell{i}"
            pending = nbformat.v4.new_markdown_cell(text, metadata={
                "tags": ["remove-cell"], "course": {MARK: fig_id}})
            pending["id"] = f"{fig_id}-caption"[:64]
    if pending is not None:
        out.append(pending)
    return [copy.deepcopy(c) if is_caption(c) else c for c in out]
