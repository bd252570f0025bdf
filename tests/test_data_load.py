"""data_load.py and idsfile.py: the binary ids, shift, padding, token budget, evaluation order, and the batches of
the text-based pipeline this one replaced (kept here as the reference: same pairs, same order, same padding)."""
import collections
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import prepro
from toolkit.data.bpe_dropout import Merges, seeded_draw, segment_lines, segment_word
from data_load import (BOS_ID, EOS_ID, UNK_ID, bucket_widths, epoch_pairs, eval_order, generator_fn, get_batch,
                       load_side, load_vocab, pad, plan_batches, sampled_side, select_pairs, text_ids,
                       trained_target_tokens)
from toolkit.data.datadir import bpe_model_path, load_manifest, split_paths
from toolkit.base.errors import UserError
from toolkit.base.ids import IdsWriter, ids_dtype, read_ids

tf1 = tf.compat.v1

V1_DATA_DIR = Path(__file__).resolve().parent / "fixtures" / "v1_model" / "numbers"
#: The prepro command that wrote V1_DATA_DIR (tests/fixtures/v1_model/README.md).
V1_PREPRO = ["--dataset", "numbers", "--n_train", "300", "--n_eval", "8", "--n_test", "8", "--vocab_size", "120"]


# ------------------------------------------------------------------------------------------------
# The text-based pipeline before the ids were memory-mapped: the reference the batches must equal


def reference_load_data(fpath1, fpath2, maxlen1=None, maxlen2=None, truncate=False):
    """Line-aligned segmented files -> kept (or truncated) pairs of strings, and the count over the limits."""
    lines1, lines2 = Path(fpath1).read_text("utf-8").splitlines(), Path(fpath2).read_text("utf-8").splitlines()
    if maxlen1 is None and maxlen2 is None:
        return lines1, lines2, 0
    sents1, sents2, over = [], [], 0
    for sent1, sent2 in zip(lines1, lines2):
        pieces1, pieces2 = sent1.split(), sent2.split()
        if len(pieces1) + 1 > maxlen1 or len(pieces2) + 1 > maxlen2:
            over += 1
            if not truncate:
                continue
            sent1, sent2 = " ".join(pieces1[:maxlen1 - 1]), " ".join(pieces2[:maxlen2 - 1])
        sents1.append(sent1)
        sents2.append(sent2)
    return sents1, sents2, over


def reference_plan_batches(lengths1, lengths2, batch_size, batch_type, rng=None, growth=0.05):
    """The plan of an epoch as it was made pair by pair in Python."""
    n = len(lengths1)
    if batch_type == "sentences":
        order = rng.permutation(n) if rng is not None else np.arange(n)
        return [(order[i:i + batch_size], None) for i in range(0, n, batch_size)]
    longest = np.maximum(lengths1, lengths2)
    widths = bucket_widths(longest.max(initial=1), growth)
    bucket = widths[np.searchsorted(widths, longest)]
    order = np.arange(n)
    if rng is not None:
        ties = rng.permutation(n)
        order = ties[np.lexsort((lengths2[ties], lengths1[ties], bucket[ties]))]
    batches, start, width = [], 0, 1
    for end, idx in enumerate(order, 1):
        width = max(width, bucket[idx])
        while end - start >= batch_size // width:
            batches.append((order[start:start + batch_size // width], int(width)))
            start += batch_size // width
            width = bucket[order[start:end]].max(initial=1)
    if start < n:
        batches.append((order[start:], int(width)))
    if rng is not None:
        rng.shuffle(batches)
    return batches


def reference_batches(data_dir, split, maxlen1, maxlen2, batch_size, batch_type, seed, epoch, truncate=False):
    """Every batch of an epoch as the text-based pipeline made it: (x, x_seqlen, decoder_input, y, y_seqlen)."""
    manifest = load_manifest(str(data_dir))
    files = manifest["splits"][split]
    sents1, sents2, _ = reference_load_data(Path(data_dir) / files["bpe1"], Path(data_dir) / files["bpe2"],
                                            maxlen1, maxlen2, truncate)
    token2idx, _ = load_vocab(str(Path(data_dir) / manifest["bpe_vocab"]))
    xs_ids = [[token2idx.get(p, UNK_ID) for p in s.split()] + [EOS_ID] for s in sents1]
    ys_ids = [[BOS_ID] + [token2idx.get(p, UNK_ID) for p in s.split()] + [EOS_ID] for s in sents2]
    lengths1, lengths2 = np.array([len(x) for x in xs_ids]), np.array([len(y) - 1 for y in ys_ids])
    rng = np.random.RandomState(seed + epoch) if seed is not None else None
    batches = []
    for batch, width in reference_plan_batches(lengths1, lengths2, batch_size, batch_type, rng):
        x, x_seqlen = pad([xs_ids[i] for i in batch], width)
        decoder_input, y_seqlen = pad([ys_ids[i][:-1] for i in batch], width)
        y, _ = pad([ys_ids[i][1:] for i in batch], width)
        batches.append((x, x_seqlen, decoder_input, y, y_seqlen))
    return batches


# ------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def numbers_dir(tmp_path_factory):
    """A small numbers data dir (format 2)."""
    data_dir = tmp_path_factory.mktemp("data_load") / "numbers"
    assert prepro.main(["--dataset", "numbers", "--n_train", "1500", "--n_eval", "40", "--n_test", "10",
                        "--vocab_size", "200", "--data_dir", str(data_dir)]) == 0
    return data_dir


def epoch_batches(data_dir, split, maxlen1, maxlen2, batch_size, batch_type, seed, epoch=0, skip=0, truncate=False,
                  bpe_dropout=0.0):
    """The batches of get_batch as numpy tuples (x, x_seqlen, decoder_input, y, y_seqlen), through tf.data."""
    with tf.Graph().as_default():
        dataset, _, _, _ = get_batch(str(data_dir), load_manifest(str(data_dir)), split, maxlen1, maxlen2,
                                     batch_size, shuffle=seed is not None, batch_type=batch_type, seed=seed or 0,
                                     truncate=truncate, epoch=epoch, skip=skip, bpe_dropout=bpe_dropout)
        (x, x_seqlen), (decoder_input, y, y_seqlen) = tf1.data.make_one_shot_iterator(dataset).get_next()
        values = []
        with tf1.Session() as sess:
            while True:
                try:
                    values.append(sess.run((x, x_seqlen, decoder_input, y, y_seqlen)))
                except tf.errors.OutOfRangeError:
                    return values


def assert_same_batches(actual, expected):
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        for got_array, want_array in zip(got, want):
            assert got_array.dtype == np.int32 and got_array.shape == want_array.shape
            np.testing.assert_array_equal(got_array, want_array)


# ------------------------------------------------------------------------------------------------
# The binary ids


@pytest.mark.parametrize("vocab_size", [300, 70000])
def test_ids_round_trip_byte_exact_with_empty_lines(tmp_path, vocab_size):
    rng = np.random.RandomState(vocab_size)
    lines = [rng.randint(0, vocab_size, rng.randint(0, 9)).tolist() for _ in range(50)] + [[], [vocab_size - 1]]
    lines[0], lines[7] = [], []
    writer = IdsWriter(tmp_path / "a.ids", tmp_path / "a.offsets", ids_dtype(vocab_size))
    writer.write(lines[:20])  # in two chunks, as prepro writes them
    writer.write(lines[20:])
    writer.close()
    dtype = np.dtype("<u2") if vocab_size < 65536 else np.dtype("<i4")
    flat = [i for line in lines for i in line]
    assert (tmp_path / "a.ids").read_bytes() == np.array(flat, dtype).tobytes()
    assert (tmp_path / "a.offsets").read_bytes() == np.cumsum([0] + [len(l) for l in lines]).astype("<i8").tobytes()
    ids, offsets = read_ids(tmp_path / "a.ids", tmp_path / "a.offsets", ids_dtype(vocab_size))
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(lines))] == lines


def test_a_side_without_ids_and_a_damaged_ids_file(tmp_path):
    writer = IdsWriter(tmp_path / "e.ids", tmp_path / "e.offsets", ids_dtype(10))
    writer.write([[], []])
    writer.close()
    ids, offsets = read_ids(tmp_path / "e.ids", tmp_path / "e.offsets", ids_dtype(10))
    assert len(ids) == 0 and offsets.tolist() == [0, 0, 0]
    (tmp_path / "e.ids").write_bytes(b"\0\0")
    with pytest.raises(UserError, match="the data dir is damaged; rebuild it with `python prepro.py --force`"):
        read_ids(tmp_path / "e.ids", tmp_path / "e.offsets", ids_dtype(10))


def test_the_ids_files_hold_the_bpe_text_through_the_vocabulary(numbers_dir):
    manifest = load_manifest(str(numbers_dir))
    assert manifest["format"] == 2 and manifest["ids_dtype"] == "uint16"
    token2idx, _ = load_vocab(str(numbers_dir / "bpe.vocab"))
    for split in ("train", "eval", "test"):
        for side in (1, 2):
            ids, offsets = load_side(str(numbers_dir), manifest, split, side)
            from_text = text_ids(str(numbers_dir / manifest["splits"][split]["bpe%d" % side]), token2idx)
            np.testing.assert_array_equal(ids, from_text[0])
            np.testing.assert_array_equal(offsets, from_text[1])


# ------------------------------------------------------------------------------------------------
# The same batches as the text-based pipeline


@pytest.mark.parametrize("batch_type, batch_size, maxlen, truncate", [
    ("tokens", 300, 20, False), ("tokens", 256, 12, True), ("sentences", 32, 20, False)])
def test_training_batches_equal_the_text_pipeline_for_a_seed(numbers_dir, batch_type, batch_size, maxlen, truncate):
    for seed, epoch in ((1, 0), (1, 3), (42, 1)):
        expected = reference_batches(numbers_dir, "train", maxlen, maxlen, batch_size, batch_type, seed, epoch,
                                     truncate)
        assert_same_batches(epoch_batches(numbers_dir, "train", maxlen, maxlen, batch_size, batch_type, seed, epoch,
                                          truncate=truncate), expected)


def rows(batches):
    """The unpadded rows (x, decoder_input, y) of batches (x, x_seqlen, decoder_input, y, y_seqlen), in turn."""
    return [(tuple(x[i, :x_seqlen[i]]), tuple(decoder_input[i, :y_seqlen[i]]), tuple(y[i, :y_seqlen[i]]))
            for x, x_seqlen, decoder_input, y, y_seqlen in batches for i in range(len(x))]


def test_evaluation_batches_hold_every_line_sorted_by_source_length(numbers_dir):
    in_line_order = rows(reference_batches(numbers_dir, "eval", None, None, 16, "sentences", None, 0))
    order = eval_order(str(numbers_dir), load_manifest(str(numbers_dir)), "eval")
    assert sorted(order) == list(range(len(in_line_order))) and list(order) != sorted(order)
    batches = epoch_batches(numbers_dir, "eval", None, None, 16, "sentences", None)
    assert rows(batches) == [in_line_order[line] for line in order]
    x_seqlen = np.concatenate([batch[1] for batch in batches])
    assert (np.diff(x_seqlen) >= 0).all()  # each batch decodes sentences of similar length


@pytest.mark.parametrize("seed", range(20))
def test_the_plan_equals_the_pair_by_pair_plan(seed):
    rng = np.random.RandomState(seed)
    n = rng.randint(1, 3000)
    lengths1 = rng.randint(1, rng.randint(2, 120), n)
    lengths2 = np.maximum(1, lengths1 + rng.randint(-5, 6, n))
    batch_size = int(rng.choice([150, 500, 1000, 4096]))
    growth = float(rng.choice([0.05, 0.1, 0.3]))
    for batch_type in ("tokens", "sentences"):
        got = plan_batches(lengths1, lengths2, batch_size, batch_type, np.random.RandomState(seed), growth)
        want = reference_plan_batches(lengths1, lengths2, batch_size, batch_type, np.random.RandomState(seed), growth)
        assert [(b.tolist(), w) for b, w in got] == [(b.tolist(), w) for b, w in want]


def test_resuming_mid_epoch_replays_the_same_batches(numbers_dir):
    whole = epoch_batches(numbers_dir, "train", 20, 20, 300, "tokens", seed=5, epoch=2)
    assert_same_batches(epoch_batches(numbers_dir, "train", 20, 20, 300, "tokens", seed=5, epoch=2, skip=7), whole[7:])


def test_the_target_tokens_counted_for_a_run_are_those_of_the_batches_it_trained(numbers_dir):
    manifest = load_manifest(str(numbers_dir))
    pairs, _ = select_pairs(load_side(str(numbers_dir), manifest, "train", 1),
                            load_side(str(numbers_dir), manifest, "train", 2), 20, 20)
    epochs = [epoch_batches(numbers_dir, "train", 20, 20, 300, "tokens", seed=5, epoch=epoch) for epoch in (0, 1)]
    drawn = [int(batch[4].sum()) for batches in epochs for batch in batches]  # y_seqlen: targets with </s>
    per_epoch = len(epochs[0])
    for steps in (1, per_epoch, per_epoch + 3):
        assert trained_target_tokens(lambda epoch: (pairs, 0), steps, 300, "tokens", 5) == sum(drawn[:steps])
    # whole epochs train every target once each
    assert (trained_target_tokens(lambda epoch: (pairs, 0), 2 * per_epoch, 300, "tokens", 5)
            == 2 * int(pairs.lengths2.sum()))
    # --accum_steps 3: a step takes 3 batches, the last step of an epoch the batches left
    steps_per_epoch = -(-per_epoch // 3)
    counted = [trained_target_tokens(lambda epoch: (pairs, 0), steps, 300, "tokens", 5, accum_steps=3)
               for steps in (1, steps_per_epoch, steps_per_epoch + 1)]
    assert counted == [sum(drawn[:3]), sum(drawn[:per_epoch]), sum(drawn[:per_epoch + 3])]


# ------------------------------------------------------------------------------------------------
# BPE-dropout: the training text segmented anew each epoch


def bpe_files(data_dir, side):
    """(Merges of the data dir's BPE model, its sentencepiece processor, the train split's .bpe and text files of
    that side)."""
    manifest = load_manifest(str(data_dir))
    paths = split_paths(str(data_dir), manifest, "train")
    model = bpe_model_path(str(data_dir), manifest)
    return (Merges.from_model(model), spm.SentencePieceProcessor(model_file=model), paths["bpe%d" % side],
            paths["raw%d" % side])


def test_bpe_dropout_at_rate_0_segments_as_sentencepiece_does(tmp_path):
    """Against sentencepiece's own BPE on words made to tie: a model trained on runs of two letters, and words of
    those letters drawn at random, where the same merge fits at several places (the leftmost goes first)."""
    rng = np.random.RandomState(0)
    corpus = [" ".join("".join(rng.choice(list("ab"), rng.randint(1, 9))) for _ in range(6)) for _ in range(300)]
    (tmp_path / "corpus.txt").write_text("\n".join(corpus), "utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "ab"),
                                   model_type="bpe", vocab_size=30, character_coverage=1.0,
                                   normalization_rule_name="identity", minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "ab.model"))
    merges = Merges.from_model(str(tmp_path / "ab.model"))
    words = ["".join(rng.choice(list("ab"), rng.randint(1, 13))) for _ in range(500)]
    lines = [" ".join(words[i:i + 5]) for i in range(0, 500, 5)]
    expected = [processor.encode(line) for line in lines]
    assert segment_lines([processor.encode(line, out_type=str) for line in lines], merges, 0.0, None) == expected
    # from the words whole: the merges alone make the model's pieces
    whole = [["\u2581" + word for word in line.split()] for line in lines]
    assert segment_lines(whole, merges, 0.0, None) == expected


def test_bpe_dropout_gives_each_segmentation_with_the_probability_of_the_algorithm():
    """The word "abc" with the merges ab > bc > abc, at rate p: the first step keeps ab with probability 1 - p
    (then abc with 1 - p), else bc with 1 - p (then abc with 1 - p), else nothing merges."""
    scores, p, n = {"ab": 3.0, "bc": 2.0, "abc": 1.0}, 0.3, 40000
    draw = seeded_draw([11])
    counts = collections.Counter(tuple(segment_word("abc", scores, p, draw)) for _ in range(n))
    expected = {("abc",): (1 - p) ** 2 * (1 + p), ("ab", "c"): (1 - p) * p, ("a", "bc"): p * p * (1 - p),
                ("a", "b", "c"): p * p}
    assert set(counts) == set(expected)
    for pieces, probability in expected.items():
        assert abs(counts[pieces] / n - probability) < 4 * (probability * (1 - probability) / n) ** 0.5, pieces


def test_bpe_dropout_segments_the_same_text_into_finer_pieces_reproducibly(numbers_dir):
    merges, processor, bpe_text, text = bpe_files(numbers_dir, 2)
    ids, offsets = load_side(str(numbers_dir), load_manifest(str(numbers_dir)), "train", 2)
    unsampled = sampled_side(merges, bpe_text, 0.0, [1])
    np.testing.assert_array_equal(unsampled[0], ids)  # rate 0: prepro's pieces
    np.testing.assert_array_equal(unsampled[1], offsets)
    sampled_ids, sampled_offsets = sampled_side(merges, bpe_text, 0.3, [5, 0, 2])
    lines = Path(text).read_text("utf-8").splitlines()
    assert [processor.decode(sampled_ids[a:b].tolist()) for a, b in zip(sampled_offsets, sampled_offsets[1:])] == lines
    assert len(sampled_ids) > 1.1 * len(ids)
    # the same seed gives the same pieces, in any thread, and in chunks of any size; another seed others
    again = {}
    thread = threading.Thread(target=lambda: again.update(side=sampled_side(merges, bpe_text, 0.3, [5, 0, 2])))
    thread.start()
    thread.join()
    np.testing.assert_array_equal(again["side"][0], sampled_ids)
    import data_load
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data_load, "SAMPLING_CHUNK_LINES", 7)
        chunked_ids, chunked_offsets = sampled_side(merges, bpe_text, 0.3, [5, 0, 2])
    np.testing.assert_array_equal(chunked_ids, sampled_ids)
    np.testing.assert_array_equal(chunked_offsets, sampled_offsets)
    assert not np.array_equal(sampled_side(merges, bpe_text, 0.3, [5, 1, 2])[0], sampled_ids)


def test_bpe_dropout_epochs_differ_and_a_resumed_run_or_a_count_replays_them(numbers_dir):
    args = (numbers_dir, "train", 60, 60, 300, "tokens", 5)  # limits that the finer pieces keep within
    first = epoch_batches(*args, epoch=1, bpe_dropout=0.2)
    assert not all(np.array_equal(a[3], b[3]) for a, b in zip(first, epoch_batches(*args, epoch=2, bpe_dropout=0.2)))
    assert_same_batches(epoch_batches(*args, epoch=1, skip=4, bpe_dropout=0.2), first[4:])
    unsampled = sum(int(batch[4].sum()) for batch in epoch_batches(*args, epoch=1))
    assert sum(int(batch[4].sum()) for batch in first) > unsampled  # finer pieces, more target tokens
    pairs_of = epoch_pairs(str(numbers_dir), load_manifest(str(numbers_dir)), "train", 60, 60, bpe_dropout=0.2,
                           seed=5)
    drawn = [int(batch[4].sum()) for epoch in (0, 1) for batch in epoch_batches(*args, epoch=epoch, bpe_dropout=0.2)]
    assert trained_target_tokens(pairs_of, len(drawn) - 2, 300, "tokens", 5) == sum(drawn[:-2])


# ------------------------------------------------------------------------------------------------
# Data dirs of manifest format 1 (text only)


def test_a_format_1_data_dir_gives_the_batches_of_its_format_2_rebuild(tmp_path):
    rebuilt = tmp_path / "numbers"
    assert prepro.main(V1_PREPRO + ["--data_dir", str(rebuilt)]) == 0
    assert load_manifest(str(V1_DATA_DIR))["format"] == 1
    for name in ("train.1.bpe", "train.2.bpe", "eval.1.bpe", "bpe.vocab"):
        assert (V1_DATA_DIR / name).read_bytes() == (rebuilt / name).read_bytes()
    assert_same_batches(epoch_batches(V1_DATA_DIR, "train", 30, 30, 200, "tokens", seed=3),
                        epoch_batches(rebuilt, "train", 30, 30, 200, "tokens", seed=3))


def test_prepro_over_a_format_1_data_dir_says_to_rerun_it_with_force(tmp_path, capsys):
    old = tmp_path / "numbers"
    shutil.copytree(V1_DATA_DIR, old)
    assert prepro.main(V1_PREPRO + ["--data_dir", str(old)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "was written by an older prepro.py (manifest format 1, now 2): re-run prepro.py with --force" in error
    assert prepro.main(V1_PREPRO + ["--data_dir", str(old), "--force"]) == 0
    assert load_manifest(str(old))["format"] == 2


# ------------------------------------------------------------------------------------------------
# Plans, padding and the token budget


def small_pairs(src, tgt, maxlen=None):
    """Pairs of two lists of id lists (see data_load.Pairs) and the count of pairs over maxlen on either side."""
    def side(lines):
        return (np.array([i for line in lines for i in line], np.int32),
                np.cumsum([0] + [len(line) for line in lines]).astype(np.int64))
    return select_pairs(side(src), side(tgt), maxlen, maxlen)


def test_decoder_input_is_target_shifted_right_and_padding_is_zero():
    src = [[4, 5], [], [6, 7, 8]]
    tgt = [[9], [10, 11], []]
    generate, num_batches = generator_fn(lambda epoch: small_pairs(src, tgt), batch_size=2)
    batches = list(generate(0))
    assert num_batches() == len(batches) == 2
    (x, x_seqlen), (decoder_input, y, y_seqlen) = batches[0]  # lines 1 and 0: sorted by source length
    assert x.tolist() == [[EOS_ID, 0, 0], [4, 5, EOS_ID]] and x_seqlen.tolist() == [1, 3]
    assert decoder_input.tolist() == [[BOS_ID, 10, 11], [BOS_ID, 9, 0]]
    assert y.tolist() == [[10, 11, EOS_ID], [9, EOS_ID, 0]] and y_seqlen.tolist() == [3, 2]
    (x, x_seqlen), (decoder_input, y, y_seqlen) = batches[1]
    assert x.tolist() == [[6, 7, 8, EOS_ID]] and decoder_input.tolist() == [[BOS_ID]] and y.tolist() == [[EOS_ID]]


def test_training_skips_or_truncates_long_pairs():
    src = [[4] * n for n in (1, 3, 5, 2)]
    tgt = [[5] * n for n in (4, 1, 1, 2)]
    side = lambda lines: (np.array([i for l in lines for i in l], np.int32),
                          np.cumsum([0] + [len(l) for l in lines]).astype(np.int64))
    kept, over = select_pairs(side(src), side(tgt), 4, 4)
    assert over == 2 and kept.lengths1.tolist() == [4, 3] and kept.lengths2.tolist() == [2, 3]  # with </s>
    cut, over_truncated = select_pairs(side(src), side(tgt), 4, 4, truncate=True)
    assert over_truncated == 2 and cut.lengths1.tolist() == [2, 4, 4, 3] and cut.lengths2.tolist() == [4, 2, 2, 3]


def test_skipping_chunk_by_chunk_keeps_the_right_lines(monkeypatch):
    """Lengths are filtered in chunks (data_load.CHUNK_LINES): with chunks of 3 lines, the kept pairs' batches hold
    exactly the lines within the limits, in line order, as a one-pass filter over all lines gives them."""
    import data_load
    monkeypatch.setattr(data_load, "CHUNK_LINES", 3)
    rng = np.random.RandomState(0)
    src = [list(rng.randint(4, 50, n)) for n in rng.randint(0, 8, 20)]
    tgt = [list(rng.randint(4, 50, n)) for n in rng.randint(0, 8, 20)]
    kept, over = small_pairs(src, tgt, maxlen=5)
    expected = [i for i in range(20) if len(src[i]) < 5 and len(tgt[i]) < 5]
    assert over == 20 - len(expected) > 0 and kept.lines.tolist() == expected
    (x, x_seqlen), (_, y, y_seqlen) = next(generator_fn(lambda epoch: (kept, over), batch_size=20, seed=None)[0]())
    order = sorted(expected, key=lambda i: len(src[i]))  # sentences mode without a seed: by source length
    assert [list(r[:n - 1]) for r, n in zip(x, x_seqlen)] == [src[i] for i in order]
    assert [list(r[:n - 1]) for r, n in zip(y, y_seqlen)] == [tgt[i] for i in order]


def test_token_batches_have_little_padding():
    rng = np.random.RandomState(0)
    lengths1 = rng.randint(3, 40, 5000)
    lengths2 = np.maximum(2, lengths1 + rng.randint(-4, 5, 5000))  # translations have correlated lengths
    batches = plan_batches(lengths1, lengths2, 1000, "tokens", np.random.RandomState(1))
    real = sum(lengths1[b].sum() + lengths2[b].sum() for b, _ in batches)
    padded = sum(len(b) * 2 * width for b, width in batches)
    assert sorted(np.concatenate([b for b, _ in batches])) == list(range(5000))
    assert 1 - real / padded < 0.10


def test_token_batches_without_shuffle_are_grouped_by_bucket_and_keep_the_budget():
    lengths = np.array([9, 3, 3, 3, 2])
    batches = plan_batches(lengths, lengths, 20, "tokens")
    # sorted by bucket: 4 (2), 1, 2, 3 (3), 0 (9); the pair of width 9 closes batches of 20 // 9 = 2 pairs
    assert [(list(b), width) for b, width in batches] == [([4, 1], 9), ([2, 3], 9), ([0], 9)]


def test_bucket_widths_by_hand():
    assert list(bucket_widths(30, 0.05)) == list(range(1, 22)) + [23, 25, 27, 29, 31]
    assert list(bucket_widths(12, 0.25)) == [1, 2, 3, 4, 5, 7, 9, 12]


def test_token_batches_come_in_few_shapes_within_budget():
    rng = np.random.RandomState(2)
    lengths1 = rng.randint(3, 60, 3000)
    lengths2 = np.maximum(2, lengths1 + rng.randint(-6, 7, 3000))
    batches = plan_batches(lengths1, lengths2, 500, "tokens", np.random.RandomState(3), growth=0.1)
    widths = bucket_widths(max(lengths1.max(), lengths2.max()), 0.1)
    shapes = {(len(b), width) for b, width in batches}
    for b, width in batches:
        assert width in widths and max(lengths1[b].max(), lengths2[b].max()) <= width
        assert len(b) * width <= 500
    full = [len(b) == 500 // width for b, width in batches]
    assert sum(full) >= len(batches) - 1  # all but the last batch: one shape per width
    assert len(shapes) <= len({width for _, width in batches}) + 1
    assert sorted(np.concatenate([b for b, _ in batches])) == list(range(3000))


def test_shuffle_depends_on_seed_and_epoch_only():
    lengths = np.arange(1, 41)
    plan = lambda seed: [list(b) for b, _ in plan_batches(lengths, lengths, 5, "sentences",
                                                          np.random.RandomState(seed))]
    assert plan(7) == plan(7) and plan(7) != plan(8)
    assert [list(b) for b, _ in plan_batches(lengths, lengths, 5, "sentences")] == \
        [list(range(i, i + 5)) for i in range(0, 40, 5)]


def test_vocab_and_text_ids(tmp_path):
    vocab = ["<pad>", "<unk>", "<s>", "</s>", "▁a", "▁b", "▁c", "d"]
    (tmp_path / "bpe.vocab").write_text("".join("%s\t0\n" % p for p in vocab), encoding="utf-8")
    (tmp_path / "x.bpe").write_text("▁a d ▁zz\n\n▁c\n", encoding="utf-8")
    token2idx, idx2token = load_vocab(str(tmp_path / "bpe.vocab"))
    assert [token2idx[p] for p in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3] and idx2token[4] == "▁a"
    ids, offsets = text_ids(str(tmp_path / "x.bpe"), token2idx)
    assert ids.tolist() == [4, 7, UNK_ID, 6] and offsets.tolist() == [0, 3, 3, 4]
