"""The bibliography and the glossary hold exactly the keys and terms the chapters may use (the
course's lists), each entry complete, and every {cite} / {term} in the book resolves."""
import re

import pytest
from book_files import ROOT, book_sources

KEYS = {"huang2019gpipe", "narayanan2019pipedream", "narayanan2021megatron",
        "shoeybi2019megatron", "rajbhandari2020zero", "li2020ddp", "zhao2023fsdp",
        "goyal2017accurate", "patarasuk2009ring",
        "thakur2005collectives", "zhang2023d2l", "korthikanti2023sequence", "chen2016checkpointing",
        "micikevicius2018mixed", "sergeev2018horovod", "ultrascale2025", "austin2025scaling",
        "paszke2019pytorch", "wu2018group", "peng2018megdet", "pytorch2025dataparallel",
        # Parts 0-II
        "qi2024zero", "deepseek2024v3", "sanders2009trees",
        "li2014parameter", "mccandlish2018empirical", "narayanan2020memory", "dean2012large",
        "williams2009roofline"}
TERMS = {"rank", "world size", "process group", "backend", "collective", "all-reduce",
         "reduce-scatter", "all-gather", "broadcast", "ring all-reduce", "replica", "shard",
         "bucket", "micro-batch", "pipeline stage", "bubble", "tensor parallelism",
         "data parallelism", "pipeline parallelism", "gradient accumulation",
         "activation checkpointing", "mixed precision", "zero", "fsdp", "device mesh", "dtensor",
         "strong scaling", "weak scaling", "latency", "bandwidth"}
BIB = ROOT / "book" / "references.bib"
GLOSSARY = ROOT / "book" / "glossary.md"


def bib_entries():
    """{key: {field: value}} of references.bib (flat fields, enough for these checks)."""
    pybtex = pytest.importorskip("pybtex.database")
    db = pybtex.parse_file(str(BIB))
    return {k: (e.type, dict(e.fields), [str(p) for p in e.persons.get("author", [])])
            for k, e in db.entries.items()}


def glossary_terms():
    text = GLOSSARY.read_text()
    body = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S).group(1)
    return {line.strip().lower(): line for line in body.splitlines()
            if line.strip() and not line.startswith(" ")}


def test_bibliography_has_exactly_the_keys_with_complete_entries():
    entries = bib_entries()
    assert set(entries) == KEYS, (f"missing {sorted(KEYS - set(entries))}, "
                                  f"extra {sorted(set(entries) - KEYS)}")
    for key, (_kind, fields, authors) in entries.items():
        assert authors and fields.get("title") and fields.get("year"), f"{key}: incomplete"
        assert fields.get("url") or fields.get("doi") or fields.get("eprint"), f"{key}: no link"
        assert fields["year"] in key, f"{key}: the key says another year than {fields['year']}"
        venue = fields.get("journal") or fields.get("booktitle") or fields.get("publisher") \
            or fields.get("howpublished") or fields.get("archiveprefix")
        assert venue, f"{key}: no venue"


def test_glossary_has_exactly_the_terms():
    terms = glossary_terms()
    assert TERMS <= set(terms), f"missing terms: {sorted(TERMS - set(terms))}"


def _sources():
    for p in book_sources():
        yield p, p.read_text()


def test_every_citation_and_term_in_the_book_resolves():
    keys, terms = set(bib_entries()), set(glossary_terms())
    bad = []
    for p, text in _sources():
        for role, arg in re.findall(r"\{(cite(?::\w+)?|term)\}`([^`]+)`", text):
            if role.startswith("cite"):
                bad += [f"{p.relative_to(ROOT)}: unknown key {k!r}"
                        for k in (s.strip() for s in arg.split(",")) if k not in keys]
            else:
                target = re.sub(r".*<(.+)>$", r"\1", arg).strip().lower()
                if target not in terms:
                    bad.append(f"{p.relative_to(ROOT)}: unknown term {arg!r}")
    assert not bad, "\n".join(bad)


def test_reference_pages_are_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    assert "book/glossary" in toc and "book/bibliography" in toc
    assert ":all:" in (ROOT / "book" / "bibliography.md").read_text(), \
        "the bibliography lists every entry, cited or not (no unused-key warnings under -W)"
