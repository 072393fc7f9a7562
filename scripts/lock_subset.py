"""Part of requirements/lock.txt, with the same versions and hashes: for CPU machines, for the book.

Usage:
  python scripts/lock_subset.py --cpu requirements/lock.txt -o _build/lock-cpu.txt
      the lock without torch, torchvision and what only the CUDA build of torch needs
      (nvidia-*, triton, cuda-*); `--torch-pins` prints `torch==X+cpu torchvision==Y+cpu`
      for the PyPI-independent CPU index (make TORCH=cpu installs those first)
  python scripts/lock_subset.py --only requirements/book.txt requirements/lock.txt -o FILE
      only the packages of that requirements file and what they need (the hosted Pages build:
      the book from stored outputs needs no torch)
Reads uv's `# via` annotations to know who needs what; standard library only (it runs before
anything is installed).
"""
import argparse
import os
import pathlib
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # scripts/ (loaded by path too)
from text_files import write_text_atomic

CUDA_ONLY = re.compile(r"^(nvidia-.*|triton|cuda-.*)$")
TORCH = ("torch", "torchvision")


def parse(text):
    """{name: (block of lines, set of dependents named in `# via`)} in file order, and the
    header (lines before the first package)."""
    blocks, header, name = {}, [], None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            name = m.group(1).lower()
            blocks[name] = ([line], set())
        elif name is None:
            header.append(line)
        else:
            blocks[name][0].append(line)
            comment = line.strip()
            if comment.startswith("#"):   # "# via x", "# via", "#   x", "#   -r file"
                words = comment.lstrip("#").split()
                words = words[1:] if words[:1] == ["via"] else words
                if words and not words[0].startswith("-"):
                    blocks[name][1].update(w.lower() for w in words)
    return header, blocks


def requirement_names(path):
    """Names pinned in a requirements file itself (not those of files it includes)."""
    names = []
    for line in pathlib.Path(path).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*[=<>!~]", line.strip())
        if m:
            names.append(m.group(1).lower())
    return names


def cpu(blocks):
    return {n: b for n, b in blocks.items() if n not in TORCH and not CUDA_ONLY.match(n)}


def closure(blocks, roots):
    """The roots and every package some package of the set needs (fixpoint over `# via`)."""
    keep = {r for r in roots if r in blocks}
    missing = [r for r in roots if r not in blocks]
    if missing:
        raise SystemExit(f"not in the lock: {missing} (run `make lock`)")
    grew = True
    while grew:
        grew = False
        for name, (_, via) in blocks.items():
            if name not in keep and via & keep:
                keep.add(name)
                grew = True
    return {n: b for n, b in blocks.items() if n in keep}


def torch_pins(blocks):
    out = []
    for n in TORCH:
        m = re.match(r"^\S+==([^\s;\\]+)", blocks[n][0][0])
        out.append(f"{n}=={m.group(1)}+cpu")
    return " ".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=pathlib.Path)
    ap.add_argument("-o", "--out", type=pathlib.Path)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--only", type=pathlib.Path)
    ap.add_argument("--torch-pins", action="store_true")
    args = ap.parse_args(argv)
    header, blocks = parse(args.lock.read_text())
    if args.torch_pins:
        print(torch_pins(blocks))
        return 0
    kept = blocks
    if args.only:
        kept = closure(blocks, requirement_names(args.only))
    if args.cpu:
        kept = cpu(kept)
    note = f"# written by scripts/lock_subset.py from {args.lock}: do not edit"
    text = "\n".join([note, *header[3:], *(ln for b, _ in kept.values() for ln in b)]) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, text)   # text_files.py: the standard library only
        print(f"wrote {args.out}: {len(kept)} of {len(blocks)} packages", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
