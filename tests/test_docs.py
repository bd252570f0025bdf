"""The documentation keeps its shape: a README a newcomer reads in five minutes, doc pages that say whether they are
a reference or a measurement log, and relative links (files and #anchors) that resolve."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150
TABLE_CELL_MAX_CHARS = 200
PAGE_KINDS = ("Reference page:", "Measurement log:")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files():
    """Every .md file of the repository, outside virtual environments, data, runs and build output."""
    skip = {".venv", ".git", "data", "runs", "build", "out", "node_modules"}
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = sorted(d for d in subdirs if d not in skip and not d.startswith("."))
        found.extend(os.path.join(directory, f) for f in sorted(files) if f.endswith(".md"))
    return found


def unfenced_lines(text):
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def prose_lines(text):
    """The lines outside code blocks, with inline code and HTML comments removed (links there are not links)."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return [re.sub(r"`[^`]*`", "", line) for line in unfenced_lines(text)]


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    """The anchors of a page's headings, with GitHub's -1, -2 suffixes for repeated ones."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen, result = {}, set()
    for line in unfenced_lines(text):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = slug(match.group(1).rstrip("#"))
            result.add(base if base not in seen else "%s-%d" % (base, seen[base]))
            seen[base] = seen.get(base, 0) + 1
    return result


def table_cells(text):
    for line in unfenced_lines(text):
        if line.startswith("|"):
            for cell in line.strip().strip("|").split("|"):
                yield cell.strip()


def test_slug_follows_github():
    assert slug("Batches (`data_load.py`)") == "batches-data_loadpy"
    assert slug("The sublayer's last bias (AMD EPYC, AVX512-BF16)") == "the-sublayers-last-bias-amd-epyc-avx512-bf16"


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.rstrip("\n").split("\n")) <= README_MAX_LINES
    long_cells = [cell for cell in table_cells(text) if len(cell) > TABLE_CELL_MAX_CHARS]
    assert long_cells == []


@pytest.mark.parametrize("path", sorted(p for p in markdown_files()
                                        if os.path.relpath(p, ROOT).split(os.sep)[0] == "docs"),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_doc_page_says_what_it_is(path):
    """The first line under a doc page's title says whether it is a reference page or a measurement log."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    assert lines[0].startswith("# ")
    assert lines[1].startswith(PAGE_KINDS), "%s: %r" % (path, lines[1][:60])


def test_relative_links_resolve():
    broken = []
    for path in markdown_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line in prose_lines(text):
            for match in LINK.finditer(line):
                target = match.group(1) or match.group(2)
                if re.match(r"[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                target_path = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                where = "%s: %s" % (os.path.relpath(path, ROOT), target)
                if not os.path.exists(target_path):
                    broken.append(where + " (no such file)")
                elif anchor and target_path.endswith(".md") and anchor not in anchors(target_path):
                    broken.append(where + " (no such heading)")
    assert broken == []
