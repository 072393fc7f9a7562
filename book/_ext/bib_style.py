"""Bibliography labels in the author-year form the citations use (sphinxcontrib-bibtex).

The chapters cite as "(Huang et al., 2019)" (`bibtex_reference_style: author_year`); pybtex's
plain style labels the list [1]...[18], so a reader finds no entry by the name the text gives.
This registers a pybtex style, `course_authoryear` (_config.yml: bibtex_default_style), that is
the plain style with labels "Huang et al., 2019": one author "Li, 2020", two "Chen and Li, 2016",
more "Huang et al., 2019"; two entries with the same label get "2019a", "2019b". The list is
sorted by author, year and title, as the plain style sorts it.
"""
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _last(person):
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


def author_year(entry):
    """'Huang et al., 2019' for one entry (authors, else editors; 'n.d.' without a year)."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_last(p) for p in people]
    if not names:
        who = entry.fields.get("organization") or entry.fields.get("title", "Anonymous")
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year(e) for e in entries]
        for label in set(labels):
            same = [i for i, lab in enumerate(labels) if lab == label]
            if len(same) > 1:   # 2019a, 2019b in the order of the list
                for n, i in enumerate(same):
                    labels[i] = label + "abcdefghijklmnopqrstuvwxyz"[n]
        yield from labels


class AuthorYearStyle(PlainStyle):
    default_label_style = "course_authoryear"


def setup(app):
    register_plugin("pybtex.style.labels", "course_authoryear", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "course_authoryear", AuthorYearStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
