"""Figures and progress: a live training plot, a progress bar, and numbers glued into the prose."""
import os

from .config import in_notebook, someone_watching

__all__ = ["Animator", "glue", "progress"]


class Animator:
    """Lines that grow epoch by epoch, redrawn in place in Jupyter (one figure, not one per
    epoch). The x axis is ticked at whole numbers (epochs); `title` says which run it is."""

    def __init__(self, xlabel=None, ylabel=None, legend=(), xlim=None, ylim=None,
                 figsize=(4.5, 3), title=None):
        import matplotlib.pyplot as plt  # here: every rank and script imports helpers
        self.fig, self.ax = plt.subplots(figsize=figsize)
        plt.close(self.fig)   # shown through the display handle only, not again at cell end
        self.labels = dict(xlabel=xlabel, ylabel=ylabel, xlim=xlim, ylim=ylim, title=title)
        self.legend, self.X, self.Y, self.handle = list(legend), None, None, None

    def add(self, x, ys):
        ys = list(ys) if hasattr(ys, "__len__") else [ys]
        if self.X is None:
            self.X, self.Y = [[] for _ in ys], [[] for _ in ys]
        for i, y in enumerate(ys):
            if y is not None:
                self.X[i].append(x)
                self.Y[i].append(y)
        self.ax.cla()
        for i, (xs, y_s) in enumerate(zip(self.X, self.Y, strict=True)):
            self.ax.plot(xs, y_s, "-o", markersize=3,
                         label=self.legend[i] if i < len(self.legend) else None)
        self.ax.set(**{k: v for k, v in self.labels.items() if v is not None})
        from matplotlib.ticker import MaxNLocator
        self.ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        self.ax.grid(True, alpha=0.3)
        if self.legend:   # below the axes: inside, it hides the curves' early epochs
            self.ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8,
                           frameon=False)
        self._show()

    def _show(self):
        if not in_notebook():
            return
        from IPython.display import display
        if self.handle is None:
            self.handle = display(self.fig, display_id=True)
        else:
            self.handle.update(self.fig)


def progress(iterable, **kwargs):
    """A progress bar (tqdm: a widget in Jupyter, text elsewhere). TQDM_DISABLE=1 turns it off,
    as the book build and the tests do (tqdm's notebook bar ignores that variable by itself),
    and so does a kernel that a program runs (config.someone_watching)."""
    from tqdm.auto import tqdm
    disable = os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes") or \
        (in_notebook() and not someone_watching())
    return tqdm(iterable, leave=False, disable=disable, **kwargs)


GLUE_PREFIX = "application/papermill.record/"   # myst-nb's (and scrapbook's) record prefix


def glue(name, value, display=True):
    """Make a computed value available to the prose ({glue:text}`name`) via myst-nb.

    Where myst-nb is not installed (Colab, a GPU machine's bare Python) the same display data
    is emitted as myst-nb's glue emits (its mimebundle, keys prefixed with GLUE_PREFIX when not
    displayed, scrapbook metadata), so a cell's outputs are identical with or without it: a
    checked cell's stored glue records stay. The value is also recorded for helpers.say, which
    fills the prose's numbers in from it."""
    from .prose import remember
    remember(name, value)
    try:
        from myst_nb import glue as _glue
    except ImportError:
        _glue = _glue_without_myst_nb
    _glue(name, value, display=display)


def _glue_without_myst_nb(name, value, display=True):
    """myst_nb.glue's output (myst-nb 1.x), written with IPython alone."""
    try:
        from IPython.core.formatters import format_display_data
        from IPython.display import display as ipy_display
    except ImportError:   # no IPython: no cell to store a record in
        return
    mimebundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    ipy_display({prefix + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)
