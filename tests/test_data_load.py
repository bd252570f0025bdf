"""data_load.py: ids, shift, padding, token budget, evaluation order."""
import numpy as np
import pytest
import tensorflow as tf

from data_load import BOS_ID, EOS_ID, bucket_widths, encode, get_batch, load_data, load_vocab, plan_batches

tf1 = tf.compat.v1

VOCAB = ["<pad>", "<unk>", "<s>", "</s>", "▁a", "▁b", "▁c", "d"]


@pytest.fixture
def corpus(tmp_path):
    """A vocabulary and line-aligned segmented files; line i has i % 7 + 1 pieces on the source side."""
    (tmp_path / "bpe.vocab").write_text("".join("%s\t0\n" % p for p in VOCAB), encoding="utf-8")
    rng = np.random.RandomState(0)
    src = [" ".join(rng.choice(VOCAB[4:], i % 7 + 1)) for i in range(60)]
    tgt = [" ".join(rng.choice(VOCAB[4:], (i * 3) % 5 + 1)) for i in range(60)]
    src[5], tgt[9] = "", ""  # empty lines stay in evaluation data
    (tmp_path / "x.bpe").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (tmp_path / "y.bpe").write_text("".join(s + "\n" for s in tgt), encoding="utf-8")
    return tmp_path, src, tgt


def batches_of(dataset):
    """All batches of a dataset as numpy values."""
    with tf.Graph().as_default():
        iterator = tf1.data.make_one_shot_iterator(dataset())
        batch = iterator.get_next()
        values = []
        with tf1.Session() as sess:
            while True:
                try:
                    values.append(sess.run(batch))
                except tf.errors.OutOfRangeError:
                    return values


def test_vocab_and_encoding(corpus):
    path, _, _ = corpus
    token2idx, idx2token = load_vocab(str(path / "bpe.vocab"))
    assert [token2idx[p] for p in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3] and idx2token[4] == "▁a"
    assert encode("▁a d ▁zz", "x", token2idx) == [4, 7, 1, EOS_ID]
    assert encode("▁a d", "y", token2idx) == [BOS_ID, 4, 7, EOS_ID]


def test_decoder_input_is_target_shifted_right_and_padding_is_zero(corpus):
    path, src, tgt = corpus
    token2idx, _ = load_vocab(str(path / "bpe.vocab"))
    make = lambda: get_batch(str(path / "x.bpe"), str(path / "y.bpe"), None, None, str(path / "bpe.vocab"), 16)[0]
    seen = 0
    for (x, x_seqlen, sent1), (decoder_input, y, y_seqlen, sent2) in batches_of(make):
        for row in range(len(x)):
            pieces = tgt[seen].split()
            ids = [token2idx[p] for p in pieces]
            assert list(y[row, :y_seqlen[row]]) == ids + [EOS_ID]
            assert list(decoder_input[row, :y_seqlen[row]]) == [BOS_ID] + ids
            assert not y[row, y_seqlen[row]:].any() and not decoder_input[row, y_seqlen[row]:].any()
            assert x_seqlen[row] == len(src[seen].split()) + 1 and not x[row, x_seqlen[row]:].any()
            assert sent1[row].decode() == src[seen] and sent2[row].decode() == tgt[seen]
            seen += 1
    assert seen == len(src)  # every line, in order, empty ones included


def test_token_batches_respect_the_budget_padding_included(corpus):
    path, src, _ = corpus
    make = lambda: get_batch(str(path / "x.bpe"), str(path / "y.bpe"), 100, 100, str(path / "bpe.vocab"), 24,
                             shuffle=True, batch_type="tokens", seed=3)[0]
    sizes = []
    for (x, _, _), (decoder_input, y, _, _) in batches_of(make):
        assert len(x) * max(x.shape[1], y.shape[1]) <= 24
        sizes.append(len(x))
    assert sum(sizes) == len(src) and max(sizes) > 1


def test_token_batches_have_little_padding():
    rng = np.random.RandomState(0)
    lengths1 = rng.randint(3, 40, 5000)
    lengths2 = np.maximum(2, lengths1 + rng.randint(-4, 5, 5000))  # translations have correlated lengths
    batches = plan_batches(lengths1, lengths2, 1000, "tokens", np.random.RandomState(1))
    real = sum(lengths1[b].sum() + lengths2[b].sum() for b, _ in batches)
    padded = sum(len(b) * 2 * width for b, width in batches)
    assert sorted(np.concatenate([b for b, _ in batches])) == list(range(5000))
    assert 1 - real / padded < 0.10


def test_token_batches_in_order_keep_the_budget():
    lengths = np.array([9, 3, 3, 3, 2])
    batches = plan_batches(lengths, lengths, 20, "tokens")
    assert [(list(b), width) for b, width in batches] == [([0, 1], 9), ([2, 3, 4], 3)]


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


def test_training_skips_or_truncates_long_pairs(corpus):
    path, src, tgt = corpus
    kept1, kept2, over = load_data(str(path / "x.bpe"), str(path / "y.bpe"), 4, 4)
    expected = [(s, t) for s, t in zip(src, tgt) if len(s.split()) < 4 and len(t.split()) < 4]
    assert list(zip(kept1, kept2)) == expected and over == len(src) - len(expected)
    cut1, cut2, over_truncated = load_data(str(path / "x.bpe"), str(path / "y.bpe"), 4, 4, truncate=True)
    assert len(cut1) == len(src) and over_truncated == over
    assert max(len(s.split()) for s in cut1 + cut2) == 3


def test_shuffle_depends_on_seed_and_epoch_only():
    lengths = np.arange(1, 41)
    plan = lambda seed: [list(b) for b, _ in plan_batches(lengths, lengths, 5, "sentences",
                                                          np.random.RandomState(seed))]
    assert plan(7) == plan(7) and plan(7) != plan(8)
    assert [list(b) for b, _ in plan_batches(lengths, lengths, 5, "sentences")] == \
        [list(range(i, i + 5)) for i in range(0, 40, 5)]
