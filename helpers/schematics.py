"""The drawing kit of the course's schematics: one look for every diagram of an idea.

Each split draws its own pictures beside its code (tensor_parallel/schematics.py, ...), from the
functions that run it, so a picture cannot drift from the code. They share this kit: large fonts
and few words (a phone shows a figure at about half its size), colours that stay apart for
colour-blind readers (Okabe and Ito's), and a white figure background (the book shows figures
on a light panel in dark mode too).
"""
__all__ = ["EVERY_RANK_COLOR", "SCHEMATIC_FONT", "LABEL_FONT", "SCHEMATIC_WIDTH", "device_color",
           "diagram", "draw_box", "draw_arrow", "phone_text_px"]

SCHEMATIC_FONT = 13                     # points; phones show figures at about half size
_PHONE_COLUMN_PX = 342                   # the book's text column on a 390-px-wide phone (CSS px)
# A phone shrinks a figure W inches wide to the column, so a label of s points shows at
# s * 342 / (72 * W) CSS px: the smallest label (LABEL_FONT) in a figure no wider than
# SCHEMATIC_WIDTH shows at 10.4 px, the least a reader reads without zooming.
LABEL_FONT = 11
SCHEMATIC_WIDTH = 5.0
# Okabe-Ito: distinguishable with every common colour-vision deficiency
_DEVICE_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                 "#000000")
EVERY_RANK_COLOR = "#BBBBBB"        # held whole by every device (replicated)


def device_color(i):
    """The colour of device (rank) i, the same in every schematic."""
    return _DEVICE_COLORS[i % len(_DEVICE_COLORS)]


def _text_color(fill):
    """Black on light fills, white on dark ones (by the fill's relative luminance)."""
    from matplotlib.colors import to_rgb
    r, g, b = to_rgb(fill)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def diagram(rows=1, cols=1, width=7.0, height=3.0, **kwargs):
    """A figure of rows x cols axes for drawing (no frames, no ticks), on a white background."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), facecolor="white",
                             squeeze=False, **kwargs)
    for ax in axes.flat:
        ax.set_axis_off()
        ax.set_facecolor("white")
    return fig, axes


def draw_box(ax, x, y, w, h, fill, label=None, fontsize=SCHEMATIC_FONT, edge="white", text=None,
             **kwargs):
    """A filled rectangle with its lower left corner at (x, y), and `label` centred in it."""
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fill, edgecolor=edge, linewidth=1.5, **kwargs))
    if label is not None:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize,
                color=text or _text_color(fill))


def draw_arrow(ax, start, end, color="black", rad=0.0, width=2.0, head=16):
    """An arrow from `start` to `end` (data coordinates); `rad` bends it; `head`: its head's
    size in points."""
    from matplotlib.patches import FancyArrowPatch
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=head, color=color,
                                 linewidth=width, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=0, shrinkB=0))


def phone_text_px(fig, column=_PHONE_COLUMN_PX):
    """(size, text) of the smallest text of `fig` in CSS pixels as the book shows it in a column
    `column` px wide: Jupyter stores the figure's tight bounding box as a PNG at fig.dpi (one
    CSS px per pixel), and the page shrinks a wider image to the column. Read from the figure
    as drawn (an SVG with its text kept as text), so hidden axes and empty labels do not count."""
    import io
    import re

    import matplotlib
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")   # as the inline backend crops
    svg = buf.getvalue()
    width_pt = float(re.search(r'<svg[^>]* width="([0-9.]+)pt"', svg).group(1))
    scale = fig.dpi / 72 * min(1.0, column / (width_pt / 72 * fig.dpi))
    texts = [(float(size) * scale, re.sub(r"<[^>]+>", "", body).strip())
             for size, body in re.findall(r'<text style="font-size: ([0-9.]+)px[^>]*>(.*?)</text>',
                                          svg, flags=re.S)]
    texts = [t for t in texts if t[1]]
    if not texts:
        raise ValueError("the figure draws no text")
    return min(texts)
