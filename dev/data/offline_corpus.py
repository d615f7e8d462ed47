"""
The default corpus when there is no internet: text already on this machine.

Why: the README's first command must train something on any machine, online or
not. Every machine that runs llm8's data tools has Python, so Python's
standard-library sources (and its docs where installed) are always there;
Debian-like systems add /usr/share/doc (READMEs, changelogs, copyright texts).

- Documents are files. .gz files are decompressed; binaries (NUL bytes) and
  non-UTF-8 files are skipped; markup, minified and generated files (.html,
  .js, .css, .svg, .xml, .json, .ps, .log) are left out as noise;
  site-packages is not stdlib.
- Files with identical text (the same license or changelog under several
  paths) are kept once, so no text can sit in both train and val.
- Order: documents sorted by sha256 of their id, a fixed shuffle that mixes the
  sources, so a --max-train-tokens cap samples all of them rather than the
  alphabetically first. The val split is held out by document (see
  tokenize_folder.py). So the corpus is deterministic for a given machine; it
  differs between machines with different Python versions or packages.
- Size: a typical machine gives a few tens of millions of tokens, far less
  than a d12 run reads (2000 steps x 524,288 tokens = 1.05B tokens). Such a
  run makes ~50 passes over the default 20M-token train split: the train loss
  keeps falling while val loss flattens and then rises (memorization). That is
  fine for comparing precisions on the same data and seed, not for judging the
  model; use FineWeb (dev/data/fineweb.py) for that.

Usage:
  python3 dev/data/offline_corpus.py [--max-train-tokens N] [--max-val-tokens N] [--source DIR ...]
"""

import argparse
import hashlib
import os
import sysconfig

from tokenize_folder import (add_tokenize_arguments, check_tokenize_arguments, die, read_text_file,
                             run_tokenize)

DEFAULT_MAX_TRAIN_TOKENS = 20_000_000
DEFAULT_MAX_VAL_TOKENS = 2_000_000
DEFAULT_VAL_FRACTION = 0.1
# markup, minified, generated (PostScript, logs) and binary formats; checked after dropping ".gz"
SKIPPED_EXTENSIONS = (".html", ".htm", ".js", ".css", ".svg", ".xml", ".json", ".map", ".ps", ".eps", ".log",
                      ".png", ".gif", ".jpg", ".jpeg", ".ico", ".pdf", ".pyc")
DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "offline")


def python_sources():
    """(name, folder, predicate) for the standard library's .py files (collect_files skips site-packages)."""
    return [("stdlib", sysconfig.get_paths()["stdlib"], lambda relpath: relpath.endswith(".py"))]


def doc_sources():
    """(name, folder, predicate) for the documentation folders that exist here, each once
    (a system Python's <prefix>/share/doc is /usr/share/doc itself)."""
    folders = [("python-docs", os.path.join(sysconfig.get_paths()["data"], "share", "doc")),
               ("usr-share-doc", "/usr/share/doc")]
    sources, seen = [], set()
    for name, folder in folders:
        if os.path.isdir(folder) and os.path.realpath(folder) not in seen:
            seen.add(os.path.realpath(folder))
            sources.append((name, folder, is_plain_text_name))
    return sources


def is_plain_text_name(relpath):
    name = relpath.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return not name.endswith(SKIPPED_EXTENSIONS) and not name.endswith("test_results")


def collect_files(sources):
    """(doc_id, path) of every accepted regular file, doc_id = "<source name>/<relative path>",
    in a fixed shuffled order. Symlinks are not followed (they duplicate files listed elsewhere),
    and site-packages / dist-packages folders are not the standard library."""
    files = []
    for name, folder, accept in sources:
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            if os.path.relpath(root, folder).split(os.sep)[0] in ("site-packages", "dist-packages"):
                dirs.clear()
                continue
            for file_name in sorted(names):
                path = os.path.join(root, file_name)
                relpath = os.path.relpath(path, folder)
                if os.path.islink(path) or not os.path.isfile(path) or not accept(relpath):
                    continue
                files.append((f"{name}/{relpath}", path))
    files.sort(key=lambda item: hashlib.sha256(item[0].encode("utf-8", "surrogateescape")).digest())
    return files


def unique_text_documents(files):
    """(doc_id, get_text) for the files; a text identical to an earlier one reads as None (skipped).
    Relies on tokenize_documents calling get_text in document order, in one thread."""
    seen_digests = set()

    def get_text(path):
        text = read_text_file(path)
        if text is None:
            return None
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if digest in seen_digests:
            return None
        seen_digests.add(digest)
        return text

    return [(doc_id, lambda path=path: get_text(path)) for doc_id, path in files]


def main():
    parser = argparse.ArgumentParser(description="Build llm8's offline corpus from text already on this machine")
    add_tokenize_arguments(parser, default_prefix="offline", default_out_dir=DEFAULT_OUT_DIR,
                           val_fraction=DEFAULT_VAL_FRACTION, max_train_tokens=DEFAULT_MAX_TRAIN_TOKENS,
                           max_val_tokens=DEFAULT_MAX_VAL_TOKENS)
    parser.add_argument("--source", action="append", default=None, metavar="DIR",
                        help="use these folders instead of the Python stdlib and doc folders (repeatable)")
    args = parser.parse_args()
    check_tokenize_arguments(args)

    if args.source:
        for folder in args.source:
            if not os.path.isdir(folder):
                die(f"--source {folder}: no such folder")
        sources = [(f"source{i}", folder, is_plain_text_name) for i, folder in enumerate(args.source)]
    else:
        sources = python_sources() + doc_sources()
    files = collect_files(sources)
    for name, folder, _ in sources:
        count = sum(1 for doc_id, _ in files if doc_id.startswith(name + "/"))
        print(f"source {name}: {folder} ({count:,} candidate files)")
    if not files:
        die("no text files found in " + ", ".join(folder for _, folder, _ in sources))

    result = run_tokenize(args, unique_text_documents(files),
                          "the offline corpus came out empty in train or val; pass --source DIR with text files",
                          require_val=True)
    print(f"offline corpus in {args.out_dir}: a d12 run of 2000 steps x 524,288 tokens reads "
          f"{2000 * 524288 / max(1, result['train'].num_tokens):.0f} epochs of this train split")


if __name__ == "__main__":
    main()
