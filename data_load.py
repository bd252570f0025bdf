"""tf.data input pipeline over the ids that prepro.py writes (idsfile.py), memory-mapped.

A batch is a pair (xs, ys) of named tuples:
    xs = Sources(x, x_seqlen):   x (N, T1) int32 = source ids + </s>, padded with 0;
                                 x_seqlen (N,)
    ys = Targets(decoder_input, y, y_seqlen):
                                 decoder_input (N, T2) = <s> + target ids;
                                 y (N, T2) = target ids + </s>; y_seqlen (N,)
No strings ride along: an empty source line is x_seqlen == 1, and references are read from the
split's text files.

An epoch is planned with numpy over the pairs' lengths only; each batch is gathered from the
memory-mapped ids and padded with numpy, so memory does not grow with the corpus (the pages of the
ids are the kernel's, shared by every process that maps them). tf.data runs the generator ahead of
the training step (prefetch). Two batching modes:
    sentences: batch_size sentences per batch, each side padded to its longest sentence;
    tokens:    length buckets. A pair's bucket is the smallest width W of bucket_widths() that holds
               its longer side. Pairs sorted by bucket fill batches of exactly batch_size // W pairs
               (all but the last), W the widest bucket among them, and both sides are padded to W:
               no batch exceeds the token budget, padding included, and training sees one batch
               shape per width, since oneDNN builds and keeps kernels for every shape, which costs
               memory and time.
With --bpe_dropout, each training epoch segments the split's pieces anew instead (epoch_pairs,
bpe_dropout.py), in memory.
Training batches are shuffled; evaluation batches (sentences mode) hold every line, sorted by source
length (length_order), and the hypotheses are put back in line order. The translators
(translate.py's and CTranslate2's) batch their sources in the same order (run_in_length_batches).
"""
import dataclasses
import functools
import itertools
import math
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from toolkit.data.bpe_dropout import Merges, segment_lines, seeded_draw
from toolkit.data.datadir import bpe_model_path, bpe_vocab_path, has_ids, split_paths
from toolkit.base.ids import read_ids, release_pages
# PAD_ID: for the tools that import it from here
from toolkit.base.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401
from toolkit.base.reading import iter_lines, read_lines  # noqa: F401


def load_vocab(vocab_fpath):
    """Reads a sentencepiece .vocab file (line i: "piece<TAB>score" of id i). Returns
    token2idx, idx2token."""
    idx2token = [line.split("\t")[0] for line in read_lines(vocab_fpath)]
    token2idx = {token: idx for idx, token in enumerate(idx2token)}
    return token2idx, dict(enumerate(idx2token))


def ids_layout(lines):
    """A list of id lists (one per line) in the layout of idsfile.py: ids (total,) int32, offsets
    (lines + 1,) int64, in memory."""
    offsets = np.zeros(len(lines) + 1, np.int64)
    offsets[1:] = np.cumsum([len(line) for line in lines])
    return np.fromiter(itertools.chain.from_iterable(lines), np.int32, int(offsets[-1])), offsets


def text_ids(bpe_fpath, token2idx):
    """The ids of a segmented text file (pieces joined by spaces; unknown pieces map to <unk>) in
    the layout of idsfile.py (ids_layout). Data dirs of manifest format 1 have only these
    text files."""
    return ids_layout([[token2idx.get(piece, UNK_ID) for piece in line.split()] for line
                       in iter_lines(bpe_fpath)])


#: Lines segmented at a time by sampled_side (as Python lists of ints, about 50 bytes a piece).
SAMPLING_CHUNK_LINES = 1 << 16


def sampled_side(merges, bpe_fpath, rate, seed):
    """One side of a split segmented anew with BPE-dropout at `rate` (bpe_dropout.py): the same
    words in other, finer pieces each time (rate 0: prepro's pieces).

    merges: the data dir's bpe_dropout.Merges. bpe_fpath: the side's prepro pieces (a .bpe file).
    seed: a list of ints; the same seed gives the same pieces. Returns (ids, offsets) in the layout
    of idsfile.py, in memory.
    """
    lines, parts, draw = iter_lines(bpe_fpath), [], seeded_draw(seed)
    while chunk := list(itertools.islice(lines, SAMPLING_CHUNK_LINES)):
        parts.append(ids_layout(segment_lines([line.split() for line in chunk], merges, rate,
                                              draw)))
    return joined_layouts(parts)


def joined_layouts(parts):
    """(ids, offsets) pairs of consecutive runs of lines (ids_layout) as one (ids, offsets) of all
    the lines."""
    starts = np.cumsum([0] + [offsets[-1] for _, offsets in parts])  # where each part's ids begin
    ids = np.concatenate([part_ids for part_ids, _ in parts] + [np.zeros(0, np.int32)])
    offsets = np.concatenate([np.zeros(1, np.int64)] + [offsets[1:] + start for (_, offsets), start
                                                         in zip(parts, starts)])
    return ids, offsets


def load_side(data_dir, manifest, split, side):
    """(ids, offsets) of one side of a split (see idsfile.py): memory-mapped, or read from its .bpe
    text file in a data dir of manifest format 1."""
    paths = split_paths(data_dir, manifest, split)
    if not has_ids(manifest):
        token2idx, _ = load_vocab(bpe_vocab_path(data_dir, manifest))
        return text_ids(paths["bpe%d" % side], token2idx)
    return read_ids(paths["ids%d" % side], paths["offsets%d" % side], manifest["ids_dtype"])


@dataclasses.dataclass
class Pairs:
    """The pairs a dataset draws batches from: pair i is line lines[i] of both sides (line i when
    lines is None). Its source pieces are ids1[offsets1[line]:offsets1[line + 1]] and lengths1[i] is
    its x_seqlen, counting </s> (cut to a limit when training truncates); its target likewise on
    side 2 (lengths2: y_seqlen). ids and offsets are those of load_side (memory maps): a corpus of
    millions of lines costs this process the two (n,) int32 length arrays (and lines when pairs were
    skipped), not copies of the offsets."""
    ids1: np.ndarray
    offsets1: np.ndarray
    lengths1: np.ndarray
    ids2: np.ndarray
    offsets2: np.ndarray
    lengths2: np.ndarray
    lines: Optional[np.ndarray] = None

    def __len__(self):
        return len(self.lengths1)

    def starts(self, index):
        """(starts1, starts2): where the pairs at `index` (N,) begin in ids1 and ids2."""
        lines = index if self.lines is None else self.lines[index]
        return self.offsets1[lines], self.offsets2[lines]


#: Lines per chunk when lengths are computed or filtered: no (n,) int64 temporary for a
#: corpus of millions.
CHUNK_LINES = 1 << 20


def sequence_lengths(offsets):
    """(n,) int32 sequence lengths counting </s> (line length + 1) of (n + 1,) offsets
    (see idsfile.py)."""
    lengths = np.empty(len(offsets) - 1, np.int32)
    for start in range(0, len(lengths), CHUNK_LINES):
        lengths[start:start + CHUNK_LINES] = np.diff(offsets[start:start + CHUNK_LINES + 1])
    lengths += 1
    return lengths


def select_pairs(side1, side2, maxlen1=None, maxlen2=None, truncate=False):
    """The pairs of two line-aligned sides within the length limits.

    side1, side2: (ids, offsets) each (see load_side). maxlen1, maxlen2: limits in pieces counting
    </s>; pairs over them are skipped (or cut to them when `truncate`). None keeps every pair, as
    evaluation must.
    Returns Pairs and the number of pairs skipped or truncated.
    """
    (ids1, offsets1), (ids2, offsets2) = side1, side2
    if len(offsets1) != len(offsets2):
        raise ValueError("side 1 has %d lines but side 2 has %d"
                         % (len(offsets1) - 1, len(offsets2) - 1))
    lengths1, lengths2 = sequence_lengths(offsets1), sequence_lengths(offsets2)
    release_pages(offsets1, offsets2)
    if maxlen1 is None and maxlen2 is None:
        return Pairs(ids1, offsets1, lengths1, ids2, offsets2, lengths2), 0
    if truncate:
        over = int(np.count_nonzero((lengths1 > maxlen1) | (lengths2 > maxlen2)))
        np.minimum(lengths1, maxlen1, out=lengths1)
        np.minimum(lengths2, maxlen2, out=lengths2)
        return Pairs(ids1, offsets1, lengths1, ids2, offsets2, lengths2), over
    # the kept pairs' lengths are moved to the front of the same arrays, chunk by chunk
    lines, kept = np.empty(len(lengths1), np.int32), 0
    for start in range(0, len(lengths1), CHUNK_LINES):
        chunk = slice(start, start + CHUNK_LINES)
        keep = (lengths1[chunk] <= maxlen1) & (lengths2[chunk] <= maxlen2)
        count = int(np.count_nonzero(keep))
        lines[kept:kept + count] = np.flatnonzero(keep) + start
        lengths1[kept:kept + count] = lengths1[start:start + CHUNK_LINES][keep]
        lengths2[kept:kept + count] = lengths2[start:start + CHUNK_LINES][keep]
        kept += count
    if kept == len(lengths1):
        return Pairs(ids1, offsets1, lengths1, ids2, offsets2, lengths2), 0
    return Pairs(ids1, offsets1, lengths1[:kept], ids2, offsets2, lengths2[:kept],
                 lines[:kept]), len(lines) - kept


def epoch_pairs(data_dir, manifest, split, maxlen1=None, maxlen2=None, truncate=False,
                bpe_dropout=0.0, seed=0):
    """pairs_of(epoch) -> (Pairs, number skipped or truncated): the pairs an epoch of a split trains
    on (see select_pairs for the limits). Without bpe_dropout, the data dir's segmentation every
    epoch; with it, the split's text segmented anew for each epoch (sampled_side, seeded with seed,
    the epoch and the side), so that a resumed run, or a count of what a run trained, replays the
    same pieces."""
    if not bpe_dropout:
        selected = select_pairs(load_side(data_dir, manifest, split, 1),
                                load_side(data_dir, manifest, split, 2), maxlen1, maxlen2, truncate)
        return lambda epoch: selected
    paths = split_paths(data_dir, manifest, split)
    merges = Merges.from_model(bpe_model_path(data_dir, manifest))

    # asked for by the epoch's plan and by the count of its batches alike; two are kept, so that the
    # budget asking for the first epoch's count while a later one trains does not push out
    # the epoch that trains
    @functools.lru_cache(maxsize=2)
    def pairs_of(epoch):
        sides = [sampled_side(merges, paths["bpe%d" % side], bpe_dropout, [seed, int(epoch), side])
                 for side in (1, 2)]
        return select_pairs(*sides, maxlen1, maxlen2, truncate)
    return pairs_of


def bucket_widths(longest, growth):
    """Padded widths of the token buckets up to `longest`: every width while a step of 1 is within
    `growth` (a fraction) of it, then each width about (1 + growth) times the previous. Returns an
    int array."""
    widths = [1]
    while widths[-1] < longest:
        widths.append(max(widths[-1] + 1, math.ceil(widths[-1] * (1 + growth))))
    return np.array(widths)


def length_order(lengths):
    """Indices that sort (n,) lengths, ties in line order. Evaluation batches take the lines in this
    order, so that a decoding loop, which runs until its longest sentence ends, decodes sentences of
    similar length; the hypotheses are put back in line order with it (utils.get_hypotheses)."""
    return np.argsort(lengths, kind="stable")


def eval_order(data_dir, manifest, split):
    """(n,) the line index of each row of a split's evaluation batches (sentences mode), in the
    order they come."""
    _, offsets = load_side(data_dir, manifest, split, 1)
    return length_order(sequence_lengths(offsets))


def run_in_length_batches(run_batch, sources, batch_size, progress=False):
    """run_batch over any number of sources in batches of batch_size sources taken in length_order;
    returns its results in the sources' order.

    run_batch(list of sources) -> a list with one result per source. sources: id lists. progress: a
    tqdm bar over the batches (shown on a terminal only).
    """
    order = length_order([len(source) for source in sources])
    results = [None] * len(sources)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc="translating", disable=None if progress else True, leave=False):
        batch = order[start:start + batch_size]
        for i, result in zip(batch, run_batch([sources[i] for i in batch])):
            results[i] = result
    return results


def plan_batches(lengths1, lengths2, batch_size, batch_type, rng=None, growth=0.05):
    """Groups example indices into batches.

    lengths1, lengths2: (n,) sequence lengths of x and y. rng: a numpy RandomState to shuffle with
    (training), or None for evaluation: in sentences mode the lines sorted by source length
    (length_order), in tokens mode grouped by bucket.
    growth: see bucket_widths (tokens mode).
    In tokens mode pairs sorted by bucket (then source and target length, ties in random order) are
    cut into batches of batch_size // W pairs padded to W: a batch closes once it holds batch_size
    // W pairs, W the bucket of the last pair in it, and the pairs left over from narrower buckets
    join the next bucket's first batch. Every batch but the last is full, so a whole epoch comes in
    about one shape per bucket (each new shape costs oneDNN kernel memory,
    docs/log/performance-log.md). Only the buckets are looped over, not the pairs.
    Returns a list of (index array, padded width): the width is None in sentences mode.
    """
    n = len(lengths1)
    if batch_type == "sentences":
        order = rng.permutation(n) if rng is not None else length_order(lengths1)
        return [(order[i:i + batch_size], None) for i in range(0, n, batch_size)]
    longest = np.maximum(lengths1, lengths2)
    if longest.max(initial=0) > batch_size:
        raise ValueError("a sentence of %d tokens does not fit in a batch of %d tokens; raise "
                         "--batch_size or lower --maxlen1/--maxlen2" % (longest.max(), batch_size))
    widths = bucket_widths(longest.max(initial=1), growth)
    # (n,) each pair's bucket, an index into widths, looked up in a table over
    # the lengths (no (n,) int64 temporary)
    bucket = np.searchsorted(widths, np.arange(widths[-1] + 1)).astype(np.int16)[longest]
    del longest
    ties = np.arange(n, dtype=np.int32 if n < 2 ** 31 else np.int64)
    if rng is not None:
        rng.shuffle(ties)  # the permutation rng.permutation(n) gives, without its int64 array
    # one key (bucket, then source length, then target length) in a stable sort: the order of a
    # lexsort over the three, in a fraction of its time and memory; int32 whenever the
    # key fits in it
    max1, max2 = int(lengths1.max(initial=0)) + 1, int(lengths2.max(initial=0)) + 1
    key = bucket[ties].astype(np.int32 if len(widths) * max1 * max2 < 2 ** 31 else np.int64)
    key *= max1
    key += lengths1[ties]
    key *= max2
    key += lengths2[ties]
    order = ties[np.argsort(key, kind="stable")]
    del key, ties
    sorted_bucket = bucket[order]
    # the last pair of each bucket
    group_ends = np.flatnonzero(np.diff(sorted_bucket)).tolist() + [n - 1]
    batches, start = [], 0
    for last in group_ends:
        width = int(widths[sorted_bucket[last]])
        size = batch_size // width
        full = (last + 1 - start) // size
        batches += [(order[i:i + size], width) for i in range(start, start + full * size, size)]
        start += full * size
    if start < n:
        batches.append((order[start:], int(widths[sorted_bucket[-1]])))
    if rng is not None:
        rng.shuffle(batches)
    return batches


class Sources(NamedTuple):
    """The source side of a batch: numpy arrays or tensors."""
    x: Any         # (N, T1) int32 source ids + </s>, padded with 0
    x_seqlen: Any  # (N,) int32 lengths, </s> included


class Targets(NamedTuple):
    """The target side of a batch: numpy arrays or tensors."""
    decoder_input: Any  # (N, T2) int32 <s> + target ids, padded with 0
    y: Any              # (N, T2) int32 target ids + </s>, padded with 0
    y_seqlen: Any       # (N,) int32 lengths, </s> included


def pad(sequences, width=None):
    """List of int lists -> (N, width) int32 array padded with 0 (width None: the longest), and the
    lengths (N,)."""
    lengths = np.array([len(s) for s in sequences], np.int32)
    array = np.zeros([len(sequences), width or lengths.max(initial=1)], np.int32)
    for row, seq in zip(array, sequences):
        row[:len(seq)] = seq
    return array, lengths


def gather(ids, starts, lengths, width, first=None, last=None):
    """Rows [first] + ids[starts[r]:starts[r] + lengths[r]] + [last] (first, last: an id or None for
    none), padded with 0 to width. ids: (total,) ids (a memory map); starts, lengths: (N,). Returns
    (N, width) int32."""
    lead = int(first is not None)
    rows = np.zeros([len(starts), width], np.int32)
    if first is not None:
        rows[:, 0] = first
    row = np.repeat(np.arange(len(starts)), lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    rows[row, within + lead] = ids[np.repeat(starts, lengths) + within]
    if last is not None:
        rows[np.arange(len(starts)), lengths + lead] = last
    return rows


def make_batch(pairs, index, width=None):
    """The batch (xs, ys) of the pairs at `index` (see the module docstring), both sides padded to
    width (None: each side to its longest sequence)."""
    x_seqlen, y_seqlen = pairs.lengths1[index], pairs.lengths2[index]
    width1, width2 = width or int(x_seqlen.max(initial=1)), width or int(y_seqlen.max(initial=1))
    starts1, starts2 = pairs.starts(index)
    x = gather(pairs.ids1, starts1, x_seqlen - 1, width1, last=EOS_ID)
    decoder_input = gather(pairs.ids2, starts2, y_seqlen - 1, width2, first=BOS_ID)
    y = gather(pairs.ids2, starts2, y_seqlen - 1, width2, last=EOS_ID)
    return Sources(x, x_seqlen), Targets(decoder_input, y, y_seqlen)


def epoch_plan(pairs, batch_size, batch_type, seed, epoch, growth=0.05):
    """plan_batches for epoch `epoch` of pairs, shuffled with numpy RandomState(seed + epoch) (seed
    None: in order), so that a resumed run, or a count of what a run trained, replays
    the same batches."""
    # numpy's seed range
    rng = np.random.RandomState((seed + epoch) % 2 ** 32) if seed is not None else None
    return plan_batches(pairs.lengths1, pairs.lengths2, batch_size, batch_type, rng, growth)


def trained_target_tokens(pairs_of, steps, batch_size, batch_type, seed, growth=0.05,
                          accum_steps=1):
    """The real (non-pad) target tokens, </s> included (y_seqlen, what train.py counts in its
    tok/s), of the shuffled training batches of the first `steps` steps, epoch after epoch: what a
    run of that many steps trained. A step takes accum_steps batches, and the last step of an epoch
    the batches left (train.py --accum_steps). pairs_of: see epoch_pairs. Counted from the epoch
    plans alone, without building a batch."""
    total, epoch = 0, 0
    while steps > 0:
        pairs, _ = pairs_of(epoch)
        plan = epoch_plan(pairs, batch_size, batch_type, seed, epoch, growth)
        if not plan:
            raise ValueError("no training pairs: nothing was trained")
        total += sum(int(pairs.lengths2[index].sum()) for index, _ in plan[:steps * accum_steps])
        steps, epoch = steps - math.ceil(len(plan) / accum_steps), epoch + 1
    return total


def generator_fn(pairs_of, batch_size=64, batch_type="sentences", seed=None, growth=0.05):
    """Returns generate(epoch), a generator of padded batches (xs, ys) as numpy arrays,
    and num_batches(epoch).

    pairs_of: epoch -> (Pairs, count over the limits), see epoch_pairs. seed: shuffle with numpy
    RandomState(seed + epoch), so a resumed run replays the same epoch; None keeps the order.
    growth: see bucket_widths (tokens mode).
    """
    # an epoch's plan is asked for by num_batches and generate alike; two are kept, as in
    # epoch_pairs, so that the budget's count of the first epoch does not push out the plan of the
    # epoch that trains
    @functools.lru_cache(maxsize=2)
    def plan_of(epoch):
        pairs, _ = pairs_of(epoch)
        return pairs, epoch_plan(pairs, batch_size, batch_type, seed, epoch, growth)

    def generate(epoch=0):
        pairs, plan = plan_of(int(epoch))
        for index, width in plan:
            batch = make_batch(pairs, index, width)
            release_pages(pairs.ids1, pairs.offsets1, pairs.ids2, pairs.offsets2)
            yield batch

    return generate, lambda epoch=0: len(plan_of(int(epoch))[1])


def input_fn(pairs_of, batch_size, shuffle=False, batch_type="sentences", seed=0, epoch=0, skip=0,
             growth=0.05):
    """tf.data.Dataset of padded batches (xs, ys) of the pairs of each epoch (pairs_of, see
    epoch_pairs), and num_batches(epoch).

    epoch, skip: int32 scalars or tensors (e.g. placeholders fed when the iterator is initialized):
    which epoch's shuffle to replay, and how many of its batches to skip (to resume in the middle of
    an epoch).
    """
    generate, num_batches = generator_fn(pairs_of, batch_size, batch_type,
                                         seed if shuffle else None, growth)
    ids, lengths = tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)
    dataset = tf.data.Dataset.from_generator(generate, args=(epoch,),
                                             output_signature=(Sources(ids, lengths),
                                                               Targets(ids, ids, lengths)))
    # tf.data's autotuner stays off: with it, re-initializing the iterator (each epoch, each dev
    # decode) can stall for seconds (docs/log/performance-log.md), and a generator followed by a
    # fixed prefetch has nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.skip(tf.cast(skip, tf.int64)).prefetch(4).with_options(options), num_batches


def get_batch(data_dir, manifest, split, maxlen1, maxlen2, batch_size, shuffle=False,
              batch_type="sentences", seed=0, truncate=False, epoch=0, skip=0, growth=0.05,
              bpe_dropout=0.0):
    """Dataset over one split of a data dir (manifest: its datadir.load_manifest). Training passes
    shuffle=True, length limits and its bpe_dropout (see epoch_pairs); evaluation passes maxlen1 =
    maxlen2 = None so that every line is kept (in length_order).

    Returns batches (tf.data.Dataset), num_batches(epoch), num_samples, and the count of pairs
    skipped (or truncated) for length (of the first epoch, with bpe_dropout). epoch and skip: see
    input_fn. growth: see bucket_widths (tokens mode).
    """
    pairs_of = epoch_pairs(data_dir, manifest, split, maxlen1, maxlen2, truncate, bpe_dropout, seed)
    pairs, over = pairs_of(0)
    batches, num_batches = input_fn(pairs_of, batch_size, shuffle, batch_type, seed, epoch, skip,
                                    growth)
    return batches, num_batches, len(pairs), over
