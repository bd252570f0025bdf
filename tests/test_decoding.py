"""Decoding: the fast path's cache decodes as the reference path does, beam search behaves as beam search should."""
import numpy as np
import pytest
import tensorflow as tf

from decoding import (CACHE_CHUNK, NEG_INF, DecodingSettings, beams, decoding_log_probs, grow_cache, nbest,
                      top_k_by_blocks, translate, write_in_place)
from model import ModelConfig, Transformer
from model_fixtures import build, random_ids, small_hp, train_step

tf1 = tf.compat.v1


@pytest.fixture(scope="module", params=["random", pytest.param("trained", marks=pytest.mark.slow)])
def decoding(request):
    """A session with a small model on the fast path (random weights, or trained 150 steps to copy-reverse its
    input) and the reference path's model over the same variables, the placeholders, and a mixed-length batch of
    sources with padding."""
    rng = np.random.RandomState(3)
    hp = small_hp(num_blocks=2)
    graph = tf.Graph()
    with graph.as_default():
        model, ph = build(hp)
        trained = request.param == "trained"
        train_op = train_step(hp, ph).batch["update"] if trained else None
        ops = {
            "cached": translate(model, ph.xs, DecodingSettings(alpha=0.6)),
            "cached_alpha0": translate(model, ph.xs, DecodingSettings(alpha=0.0)),
            "reference": translate(Transformer(ModelConfig.from_flags(small_hp(num_blocks=2, impl="reference"))),
                                   ph.xs, DecodingSettings(alpha=0.6)),
            "beam1": beams(model, ph.xs, DecodingSettings(beam_size=1, alpha=0.0)),
            "beam4": translate(model, ph.xs, DecodingSettings(beam_size=4, alpha=0.6)),
            "nbest2": nbest(model, ph.xs, DecodingSettings(beam_size=4, alpha=0.6), 2),
        }
        if trained:  # test_larger_alpha_prefers_longer_translations, with trained weights only
            for alpha in (0.0, 2.0):
                ops["beam4_alpha%g" % alpha] = translate(model, ph.xs, DecodingSettings(beam_size=4, alpha=alpha))
        ids = tf1.placeholder(tf.int32, [None, None])
        score = model.score(ph.xs, ids, alpha=0.6)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
        if trained:
            for _ in range(150):
                x = random_ids(rng, rng.randint(3, 9, 16), hp.vocab_size)
                y = x.copy()
                for row, length in zip(y, (x != 0).sum(1)):
                    row[:length - 1] = row[:length - 1][::-1]
                sess.run(train_op, ph.feed(x, y))
    x = random_ids(rng, [9, 2, 5, 7, 3, 8], hp.vocab_size, width=11)  # mixed lengths, extra padding

    def run(name):
        return sess.run(ops[name], ph.feed(x))

    def scores(translations):
        return sess.run(score, {**ph.feed(x), ids: translations})
    yield run, scores, request.param
    sess.close()


def test_fast_greedy_equals_reference_greedy(decoding):
    """The fast path's cache (grown in chunks, written in place) decodes the reference path's tokens."""
    run, _, _ = decoding
    (fast_ids, fast_scores), (reference_ids, reference_scores) = run("cached"), run("reference")
    np.testing.assert_array_equal(fast_ids, reference_ids)
    np.testing.assert_allclose(fast_scores, reference_scores, atol=1e-4)


def test_greedy_scores_are_the_models_scores(decoding):
    run, scores, _ = decoding
    ids, greedy_scores = run("cached")
    np.testing.assert_allclose(scores(ids), greedy_scores, atol=1e-4)


def test_beam_of_one_is_greedy(decoding):
    run, _, _ = decoding
    greedy_ids, greedy_scores = run("cached_alpha0")
    beam_ids, beam_scores, _ = run("beam1")
    np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, atol=1e-4)
    beam_ids = beam_ids[:, 0, :]
    width = max(greedy_ids.shape[1], beam_ids.shape[1])
    np.testing.assert_array_equal(np.pad(greedy_ids, [[0, 0], [0, width - greedy_ids.shape[1]]]),
                                  np.pad(beam_ids, [[0, 0], [0, width - beam_ids.shape[1]]]))


def test_beam_of_four_never_scores_below_greedy(decoding):
    run, scores, _ = decoding
    greedy_ids, _ = run("cached")
    beam_ids, beam_scores = run("beam4")
    np.testing.assert_allclose(scores(beam_ids), beam_scores, atol=1e-4)
    assert np.all(scores(beam_ids) >= scores(greedy_ids) - 1e-5)


def test_nbest_are_beam_searchs_best_in_order(decoding):
    run, scores, _ = decoding
    best_ids, best_scores = run("beam4")
    nbest_ids, nbest_scores = run("nbest2")  # (N, 2, T), (N, 2)
    np.testing.assert_array_equal(nbest_ids[:, 0], best_ids)
    np.testing.assert_array_equal(nbest_scores[:, 0], best_scores)
    filled = nbest_scores[:, 1] > NEG_INF / 2
    assert filled.any()
    assert np.all(nbest_scores[filled, 0] >= nbest_scores[filled, 1])
    np.testing.assert_allclose(scores(nbest_ids[:, 1])[filled], nbest_scores[filled, 1], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("decoding", ["trained"], indirect=True)
def test_larger_alpha_prefers_longer_translations(decoding):
    """Trained weights only: random ones never choose </s> before the length limit, so every alpha would give the
    same lengths."""
    run, _, _ = decoding
    short, _ = run("beam4_alpha0")
    long, _ = run("beam4_alpha2")
    short_lengths, long_lengths = (short != 0).sum(1), (long != 0).sum(1)
    assert long_lengths.sum() > short_lengths.sum(), (short_lengths, long_lengths)


@pytest.mark.slow
def test_bfloat16_cached_greedy_picks_the_whole_decoders_best_tokens():
    """Under --precision bf16 the cache holds bf16 keys and values; each token greedy decoding picks with it must be
    the best next token of the whole decoder run on the tokens before (teacher forcing), but where the step limit
    forces </s>."""
    rng = np.random.RandomState(5)
    hp = small_hp(num_blocks=2, precision="bf16")
    with tf.Graph().as_default():
        model, ph = build(hp)
        ids, _ = translate(model, ph.xs, DecodingSettings(alpha=0.6, max_len_a=3.0))
        best = tf.argmax(decoding_log_probs(model.teacher_forced(ph.xs, ids)[0]), axis=-1, output_type=tf.int32)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            x = random_ids(rng, [9, 2, 5, 7, 3, 8], hp.vocab_size, width=11)
            ids, best = sess.run([ids, best], ph.feed(x))
    real = ids != 0
    forced_end = real & (np.cumsum(real, axis=1) == real.sum(1, keepdims=True)) & (ids != best)
    np.testing.assert_array_equal(ids[real & ~forced_end], best[real & ~forced_end])


@pytest.mark.parametrize("length, block", [(800, 8), (803, 8), (60, 8), (32000, 64)])
def test_top_k_by_blocks_equals_one_top_k(length, block):
    """Beam search's two-stage top-k gives the values and indices of one tf.math.top_k, ties included: the
    scores are small integers, so most values occur many times, and some rows are all equal."""
    rng = np.random.RandomState(7)
    scores = rng.randint(-6, 3, size=(12, length)).astype(np.float32)
    scores[3] = NEG_INF
    scores[4, ::3] = 50.0  # the largest values spread over many blocks
    scores[5] = 0.0
    scores[5, -5 * block::block] = 1.0  # the top 5 in the last blocks, the rest of the top k tied in the first
    with tf.Graph().as_default(), tf1.Session() as sess:
        ph = tf1.placeholder(tf.float32, [None, length])
        two_stage, one = sess.run([top_k_by_blocks(ph, 8, block), tf.math.top_k(ph, 8)], {ph: scores})
    np.testing.assert_array_equal(two_stage[0], one[0])
    np.testing.assert_array_equal(two_stage[1], one[1])
    assert (one[1][3] == np.arange(8)).all()  # the ties resolve to the lowest indices


def test_the_cache_grows_by_chunks_and_keeps_what_each_step_wrote():
    """A loop that writes step t's values at position t: the cache grows by CACHE_CHUNK positions exactly when a
    step reaches its end, keeps every value written, and holds zeros at the positions not written yet."""
    batch, heads, d_head, steps = 3, 2, 4, 2 * CACHE_CHUNK + 3
    with tf.Graph().as_default(), tf1.Session() as sess:
        empty = tf.zeros([batch, heads, 0, d_head])

        def body(step, cache, lengths):
            cache = grow_cache(cache, step)
            cache_len = tf.shape(cache[0][0])[2]
            rows = tf.range(batch * heads) * cache_len + step
            values = tf.fill([batch * heads, d_head], tf.cast(step + 1, tf.float32))
            cache = [tuple(write_in_place(t, rows, values * sign) for t, sign in zip(pair, (1.0, -1.0)))
                     for pair in cache]
            return step + 1, cache, tf.concat([lengths, [cache_len]], 0)

        invariants = (tf.TensorShape([]), [(tf.TensorShape([None, None, None, d_head]),) * 2],
                      tf.TensorShape([None]))
        start = (0, [(empty, empty)], tf.zeros([0], tf.int32))
        _, cache, lengths = tf1.while_loop(lambda step, *_: step < steps, body, start, shape_invariants=invariants)
        (K, V), lengths = sess.run([cache[0], lengths])
    chunks = np.arange(steps) // CACHE_CHUNK + 1
    np.testing.assert_array_equal(lengths, chunks * CACHE_CHUNK)
    written = np.concatenate([np.arange(1, steps + 1), np.zeros(3 * CACHE_CHUNK - steps)]).astype(np.float32)
    np.testing.assert_array_equal(K, np.broadcast_to(written[None, None, :, None], K.shape))
    np.testing.assert_array_equal(V, -K)
