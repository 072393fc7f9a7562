"""The landing page's learning path, from _toc.yml: one item per Part (its caption) with links
to its chapters, in the book's order. ```{learning-path}``` in book/intro.md; a new Part or
chapter in _toc.yml appears there without anyone writing it (tests/test_front_matter.py keeps
the hand-written "What you will learn" list in step with the same captions).
"""
import pathlib

import yaml
from docutils import nodes
from sphinx.util.docutils import SphinxDirective

SKIP = {"For teachers", "Reference"}   # captions that are not a step of the path


class learning_path_node(nodes.General, nodes.Element):
    """Placeholder: the chapters' titles are known once every page is read."""


def parts(srcdir):
    """[(caption, [docname, ...])] of _toc.yml's parts on the path."""
    toc = yaml.safe_load((pathlib.Path(srcdir) / "_toc.yml").read_text())
    return [(p["caption"], [c["file"].removesuffix(".ipynb").removesuffix(".md")
                            for c in p.get("chapters", [])])
            for p in toc.get("parts", []) if p.get("caption") not in SKIP]


class LearningPath(SphinxDirective):
    has_content = False

    def run(self):
        self.env.note_dependency(str(pathlib.Path(self.env.srcdir) / "_toc.yml"))
        node = learning_path_node()
        self.set_source_info(node)
        return [node]


def resolve(app, doctree, docname):
    for node in list(doctree.findall(learning_path_node)):
        steps = nodes.enumerated_list(enumtype="arabic", prefix="", suffix=".")
        for caption, docs in parts(app.env.srcdir):
            para = nodes.paragraph()
            para += nodes.strong(caption, caption)
            para += nodes.Text(": ")
            for i, doc in enumerate(docs):
                title = app.env.titles[doc].astext() if doc in app.env.titles else doc
                if i:
                    para += nodes.Text("; ")
                para += nodes.reference("", title, internal=True,
                                        refuri=app.builder.get_relative_uri(docname, doc))
            para += nodes.Text(".")
            steps += nodes.list_item("", para)
        node.replace_self(steps)


def setup(app):
    app.add_node(learning_path_node)
    app.add_directive("learning-path", LearningPath)
    app.connect("doctree-resolved", resolve)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
