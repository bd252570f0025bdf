"""Where a parallel corpus comes from: the names of its splits and sides, and local files.

A corpus is {split: (source_lines, target_lines)} for the splits train, eval (dev) and test; side 1 is the
source, side 2 the target. corpora.numbers generates one, corpora.download fetches the public ones.
"""
from pathlib import Path

from errors import UserError
from textio import read_lines

SPLITS = ("train", "eval", "test")
SIDES = (1, 2)
#: The command-line flag naming each (split, side) file of --dataset files: train1, train2, ..., test2.
FILE_FLAGS = {(split, side): f"{split}{side}" for split in SPLITS for side in SIDES}


def log(message):
    """Print one progress line."""
    print(f"prepro: {message}", flush=True)


def check_same_length(lines1, lines2, name1, name2):
    """Raise UserError unless the two sides of a parallel corpus have the same number of lines."""
    if len(lines1) != len(lines2):
        raise UserError(f"{name1} has {len(lines1)} lines but {name2} has {len(lines2)}: "
                        "the two sides of a parallel corpus must have one line per sentence pair")


def unzip_pairs(pairs):
    """[(source, target), ...] -> ([source, ...], [target, ...])."""
    return [source for source, _ in pairs], [target for _, target in pairs]


def pair_up(lines, sources):
    """{(split, side): lines} -> {split: (lines1, lines2)}, checking that both sides have equal length."""
    splits = {}
    for split in SPLITS:
        check_same_length(lines[split, 1], lines[split, 2], sources[FILE_FLAGS[split, 1]],
                          sources[FILE_FLAGS[split, 2]])
        splits[split] = (lines[split, 1], lines[split, 2])
    return splits


def file_splits(paths):
    """Read local parallel files {flag: path} and return (splits, sources)."""
    for flag, path in paths.items():
        if Path(path).is_dir():
            raise UserError(f"{path} is a directory, not a file (--{flag})")
        if not Path(path).is_file():
            raise UserError(f"file not found: {path} (--{flag})")
    lines = {key: read_lines(paths[flag]) for key, flag in FILE_FLAGS.items()}
    sources = {flag: str(path) for flag, path in paths.items()}
    return pair_up(lines, sources), sources
