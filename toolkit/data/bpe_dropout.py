"""BPE-dropout (Provilkov et al., 2020): the training text segmented anew each epoch into varying,
finer pieces.

A BPE model segments a word by merging, again and again, the adjacent pair of pieces whose merged
piece ranks highest in its vocabulary (sentencepiece's rule: any pair whose concatenation is a piece
of the model, the highest score first, the leftmost of equals), until no pair merges. With
BPE-dropout, at every step each pair that could merge is dropped with probability `rate`, and the
highest-ranked pair left merges; when every pair is dropped, the word keeps the pieces it has. A
dropped pair may merge at a later step, so most words still end whole, and the others come in a few
larger pieces. At rate 0 this is the BPE model's segmentation (the tests hold it to sentencepiece's,
ties included).

This is the paper's algorithm, not sentencepiece's sampling for BPE models (`enable_sampling`,
`alpha`), in which a pair skipped once stays unmerged: one early skip then leaves the whole word in
small pieces (at 0.1, 40% more pieces on Multi30k against 21% here), which trained far worse here
(docs/log/recipe-log.md); sentencepiece's random stream also gave other pieces for the same seed in
another process, where this one is seeded by us.

    merges = Merges.from_model("data/multi30k/bpe.model")
    ids = segment_lines(lines_of_pieces, merges, 0.1, seeded_draw([1234, epoch]))

Words are segmented one by one: a piece that starts with "▁" starts a word, and no merge
crosses words.
"""
import dataclasses
import random

import numpy as np
import sentencepiece as spm

from toolkit.base.ids import UNK_ID

#: What starts a word in sentencepiece's pieces.
WORD_START = "\u2581"


@dataclasses.dataclass
class Merges:
    """A BPE model as merges: ids, piece -> id; scores, piece -> score of every piece a merge can
    make (two or more characters, not a special piece such as <s>):
    the merges' ranks, higher first."""
    ids: dict
    scores: dict

    @classmethod
    def from_model(cls, model_fpath):
        """The merges of a sentencepiece BPE model file (a data dir's bpe.model)."""
        processor = spm.SentencePieceProcessor(model_file=model_fpath)
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        special = {i for i in range(len(pieces)) if processor.is_control(i)
                   or processor.is_unknown(i)}
        scores = {piece: processor.get_score(i) for i, piece in enumerate(pieces)
                  if len(piece) > 1 and i not in special}
        return cls({piece: i for i, piece in enumerate(pieces)}, scores)


def segment_word(word, scores, rate, draw):
    """The pieces of one word (a string) by BPE with merges dropped at `rate`
    (see the module docstring).

    scores: Merges.scores. draw: a function returning uniform floats in [0, 1), called (never when
    rate is 0) at each step for each pair that would outrank the best pair kept so far: whether a
    pair that would not is dropped cannot change which pair merges. Returns a list of piece strings
    that join to word.
    """
    pieces = list(word)
    while True:
        best, at = None, None
        for i in range(len(pieces) - 1):
            score = scores.get(pieces[i] + pieces[i + 1])
            outranks = score is not None and (best is None or score > best)
            if outranks and not (rate and draw() < rate):
                best, at = score, i  # strictly greater: the leftmost of equals
        if at is None:
            return pieces
        pieces[at:at + 2] = [pieces[at] + pieces[at + 1]]


def words(pieces):
    """The words of a line given as its pieces (strings): each piece that starts with "▁"
    starts a word."""
    word = ""
    for piece in pieces:
        if piece.startswith(WORD_START) and word:
            yield word
            word = ""
        word += piece
    if word:
        yield word


def segment_lines(lines, merges, rate, draw):
    """The ids of lines (each a list of the BPE model's pieces, as prepro's .bpe files hold them),
    every word segmented again by segment_word. A piece outside the vocabulary (a character training
    never saw) is <unk>.
    Returns a list of id lists, one per line."""
    return [[merges.ids.get(piece, UNK_ID) for word in words(line)
             for piece in segment_word(word, merges.scores, rate, draw)] for line in lines]


def seeded_draw(entropy):
    """draw() for segment_word: uniform floats from Python's Mersenne Twister seeded from numpy's
    SeedSequence(entropy) (a list of ints), the same sequence in every process
    and on every platform."""
    return random.Random(int(np.random.SeedSequence(entropy).generate_state(1,
                                                                            np.uint64)[0])).random
