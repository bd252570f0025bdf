"""Prose reads as one paragraph: no word stranded on a line of its own, in the tools' --help nor in the comments
and docstrings of the top level, fast/ and toolkit/ (a column rewrap once left words alone on lines, at odd indents)."""
import ast
import importlib
import io
import os
import re
import tokenize

import pytest

from in_process import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ("train", "test", "translate", "prepro", "export", "serve", "avg_checkpoints", "plot_attention")
#: Terminal widths the help is drawn at (argparse wraps to COLUMNS - 2).
WIDTHS = (70, 100, 140)

# ---------------------------------------------------------------- --help


def indent(line):
    return len(line) - len(line.lstrip(" "))


def stranded_help_lines(text, width):
    """The lines of a --help text that hold one word which a hard break, not argparse's wrapping, put there: the line
    before is text of the same block (a help column or paragraph that reaches the word's column) and the word would
    have fitted at its end. Usage lines, section headings ("data:"), flag and metavar lines are never counted, nor a
    word that argparse moved down because the line before was full."""
    lines = text.splitlines()
    usage = False
    found = []
    for number, line in enumerate(lines):
        usage = bool(line.strip()) and (usage or line.startswith("usage:"))  # up to its first blank line
        words = line.split()
        if usage or len(words) != 1 or words[0].startswith("-") or words[0].endswith(":"):
            continue
        before = lines[number - 1] if number else ""
        column = indent(line)
        same_block = before.strip() and (indent(before) == column or (
            indent(before) < column < len(before) and before[column - 1] == " " and before[column] != " "))
        if same_block and len(before.rstrip()) + 1 + len(words[0]) <= width:
            found.append("%r after %r" % (line, before))
    return found


def test_the_rule_finds_a_hard_break_and_not_a_wrap():
    wrapped = ("  --flag FLAG   a help text that argparse wrapped at the width of the terminal, its\n"
               "                end\n")
    assert stranded_help_lines(wrapped, 86) == []
    broken = ("  --flag FLAG   a help text with a hard break after\n"
              "                its\n"
              "                end of line\n")
    assert len(stranded_help_lines(broken, 86)) == 1
    paragraph = "A description whose\nsentence\nbroke twice.\n"
    assert len(stranded_help_lines(paragraph, 80)) == 1
    assert stranded_help_lines("usage: tool.py [-h]\n               SENTENCE\n\noptions:\n  SENTENCE\n", 80) == []


@pytest.mark.parametrize("tool", TOOLS)
def test_help_has_no_stranded_word(tool, capsys, monkeypatch):
    main = importlib.import_module(tool).main
    for columns in WIDTHS:
        monkeypatch.setenv("COLUMNS", str(columns))
        code, help_text, _ = run_in_process(capsys, tool + ".py", main, "--help")
        assert code == 0 and help_text.startswith("usage: "), (tool, columns)
        assert not stranded_help_lines(help_text, columns - 2), (tool, columns)


# ---------------------------------------------------------------- comments and docstrings
#: One word, lower-case (after an opening bracket, quote or backtick), maybe ending with punctuation: not a path,
#: a shape or a formula.
WORD = re.compile(r"[(\[`'\"]*[a-z][\w'.,;:`\-]*[)\]`'\".,;:]*")
#: How a sentence or clause ends a line: a word after it starts anew.
ENDED = re.compile(r"[.:!?][)\]`'\"]*$")


def prose_blocks(source):
    """Each docstring's lines, and each run of whole-line comments at one column, as lists of (line number, text)
    with the quotes or the comment mark taken off."""
    lines = source.splitlines()
    blocks = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                texts = lines[first.lineno - 1:first.end_lineno]
                texts[0] = re.sub(r'^\s*[rRuU]?("""|\'\'\'|"|\')', "", texts[0])
                texts[-1] = re.sub(r'("""|\'\'\'|"|\')\s*$', "", texts[-1])
                blocks.append(list(enumerate(texts, first.lineno)))
    run, column = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or lines[token.start[0] - 1][:token.start[1]].strip():
            continue
        number = token.start[0]
        if not run or number != run[-1][0] + 1 or token.start[1] != column:
            blocks.append(run)
            run, column = [], token.start[1]
        run.append((number, re.sub(r"^#:?", "", token.string)))
    blocks.append(run)
    return [block for block in blocks if block]


def stranded_prose_lines(source):
    """Lines of comments and docstrings that hold a single lower-case word continuing the line before's sentence."""
    found = []
    for block in prose_blocks(source):
        for (_, before), (number, text) in zip(block, block[1:]):
            if WORD.fullmatch(text.strip()) and before.strip() and not ENDED.search(before.rstrip()):
                found.append("%d: %r after %r" % (number, text.strip(), before.strip()))
    return found


def test_the_prose_rule_finds_a_stranded_word():
    source = ('"""A module whose docstring has\nwhitespace\nleft alone, and a sentence that ends.\n\nNew."""\n'
              "# a comment that goes\n#   on\nx = 1  # inline\n# a new one.\n# fine\n")
    assert [found.split(":")[0] for found in stranded_prose_lines(source)] == ["2", "7"]


def python_files():
    """The top level's, fast/'s and toolkit/'s (with its layers) .py files, relative to ROOT."""
    directories = ["", "fast"] + sorted(os.path.relpath(path, ROOT) for path, _, _
                                        in os.walk(os.path.join(ROOT, "toolkit"))
                                        if not path.endswith("__pycache__"))
    return sorted(os.path.join(directory, name) for directory in directories
                  for name in os.listdir(os.path.join(ROOT, directory)) if name.endswith(".py"))


def test_comments_and_docstrings_have_no_stranded_word():
    stranded = ["%s:%s" % (path, found) for path in python_files()
                for found in stranded_prose_lines(open(os.path.join(ROOT, path), encoding="utf-8").read())]
    assert not stranded, "\n".join(stranded)


def test_no_section_header_announces_nothing():
    """A section header ("# ---- name") is followed by what it names, not by another header."""
    header = re.compile(r"\s*# -{8,} \S")
    empty = []
    for path in python_files():
        lines = open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()
        empty += ["%s:%d" % (path, number) for number, (line, after) in enumerate(zip(lines, lines[1:]), 1)
                  if header.match(line) and header.match(after)]
    assert not empty
