"""Where a parallel corpus comes from: the names of its splits and sides, and local files.

A corpus is {split: (source_lines, target_lines)} for the splits train, eval (dev) and test; side 1
is the source, side 2 the target. Each side is re-iterable: a list, or LinesOf a file, which is read
line by line every time it is iterated, so that a corpus of any size is never held in memory.
corpora.numbers generates one, corpora.download fetches the public ones.
"""
from pathlib import Path

from toolkit.base.errors import UserError
from toolkit.base.reading import iter_lines

SPLITS = ("train", "eval", "test")
SIDES = (1, 2)
#: The command-line flag naming each (split, side) file of --dataset files:
#: train1, train2, ..., test2.
FILE_FLAGS = {(split, side): f"{split}{side}" for split in SPLITS for side in SIDES}


def log(message):
    """Print one progress line."""
    print(f"prepro: {message}", flush=True)


def check_same_length(count1, count2, name1, name2):
    """Raise UserError unless the two sides of a parallel corpus have the same number of lines."""
    if count1 != count2:
        raise UserError(f"{name1} has {count1} lines but {name2} has {count2}: "
                        "the two sides of a parallel corpus must have one line per sentence pair")


class LinesOf:
    """The lines of a text file (see toolkit.base.reading.iter_lines), read anew each time
    they are iterated."""

    def __init__(self, path):
        self.path = path

    def __iter__(self):
        return iter_lines(self.path)


def unzip_pairs(pairs):
    """[(source, target), ...] -> ([source, ...], [target, ...])."""
    return [source for source, _ in pairs], [target for _, target in pairs]


def pair_up(lines, sources):
    """{(split, side): lines} -> {split: (lines1, lines2)}, checking that both sides
    have equal length."""
    splits = {}
    for split in SPLITS:
        check_same_length(len(lines[split, 1]), len(lines[split, 2]), sources[FILE_FLAGS[split, 1]],
                          sources[FILE_FLAGS[split, 2]])
        splits[split] = (lines[split, 1], lines[split, 2])
    return splits


def file_splits(paths):
    """Local parallel files {flag: path} as (splits, sources); the files are read when the splits
    are iterated (datadir.describe_inputs checks that both sides of a split have as many lines)."""
    for flag, path in paths.items():
        if Path(path).is_dir():
            raise UserError(f"{path} is a directory, not a file (--{flag})")
        if not Path(path).is_file():
            raise UserError(f"file not found: {path} (--{flag})")
    sources = {flag: str(path) for flag, path in paths.items()}
    splits = {split: (LinesOf(paths[FILE_FLAGS[split, 1]]), LinesOf(paths[FILE_FLAGS[split, 2]]))
              for split in SPLITS}
    return splits, sources


def reversed_corpus(splits, sources):
    """The corpus with its two sides swapped, and the names of where each side came from with them,
    so that side 1 is the other language's text and a model trained on it translates
    the other direction."""
    swapped = {split: (lines2, lines1) for split, (lines1, lines2) in splits.items()}
    names = {FILE_FLAGS[split, 3 - side]: sources[FILE_FLAGS[split, side]]
             for split in SPLITS for side in SIDES if FILE_FLAGS[split, side] in sources}
    return swapped, names
