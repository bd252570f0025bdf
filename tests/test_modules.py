"""modules.py, the paper's building blocks, against hand-computed values and closed forms."""
import math

import numpy as np
import pytest
import tensorflow as tf

from modules import (dropout, ff, get_token_embeddings, label_smoothing, ln, mask, multihead_attention,
                     noam_cooldown_scheme, noam_scheme, positional_encoding, scaled_dot_product_attention,
                     warmup_decay_scheme)

from model_fixtures import run_graph

tf1 = tf.compat.v1


def test_scaled_dot_product_attention_hand_computed():
    q = [[0., 1., 0.], [0., 0., 1.]]
    k = [[1., 2., 0.], [0., 1., 1.]]
    v = [[1., 0.], [2., 0.]]
    outputs, weights = run_graph(lambda: scaled_dot_product_attention(  # (N 2, h 1, T 2, d 3)
        tf.constant([[q], [q]]), tf.constant([[k], [k]]), tf.constant([[v], [v]]), tf.zeros([2, 2], tf.bool),
        training=False))
    for batch in range(2):
        np.testing.assert_allclose(weights[batch, 0], [[0.64045745, 0.35954252], [0.35954252, 0.64045745]], rtol=1e-6)
        np.testing.assert_allclose(outputs[batch, 0], [[1.3595425, 0.], [1.6404574, 0.]], rtol=1e-6)


def test_mask_adds_the_masked_logit_at_padded_and_future_keys():
    def build():
        key_masks, scores = tf.constant([[False, True, False]]), tf.zeros([1, 2, 3, 3])  # scores: (N, h, T_q, T_k)
        return mask(scores, key_masks), mask(scores, causality=True), mask(scores, key_masks, causality=True)
    padded, future, both = run_graph(build)
    m = -1e9
    np.testing.assert_array_equal(padded[0, 1], [[0, m, 0]] * 3)
    np.testing.assert_array_equal(future[0, 0], [[0, m, m], [0, 0, m], [0, 0, 0]])
    np.testing.assert_array_equal(both[0, 1], [[0, 2 * m, m], [0, m, m], [0, m, 0]])


def test_key_mask_and_causality_zero_the_right_weights():
    q = np.random.RandomState(0).randn(2, 1, 3, 4).astype(np.float32)
    key_masks = np.array([[False, False, True], [False, False, False]])
    _, key_weights = run_graph(lambda: scaled_dot_product_attention(q, q, q, tf.constant(key_masks), training=False))
    _, future_weights = run_graph(lambda: scaled_dot_product_attention(q, q, q, None, causality=True, training=False))
    assert np.all(key_weights[0, 0, :, 2] == 0) and np.all(key_weights[1] > 0)
    np.testing.assert_allclose(key_weights.sum(-1), 1.0, rtol=1e-6)
    lower = np.tril(np.ones((3, 3), bool))
    assert np.all(future_weights[0, 0][~lower] == 0) and np.all(future_weights[0, 0][lower] > 0)


def numpy_multihead_attention(x, memory, key_masks, weights, num_heads):
    """The post-norm attention sublayer of Sections 3.2.2 and 3.1 in numpy, from the layer's variables."""
    def project(inputs, name):
        return inputs @ weights[name + "/kernel"] + weights[name + "/bias"]

    def heads(t):  # (N, T, d) -> (N, h, T, d/h)
        return t.reshape(t.shape[0], t.shape[1], num_heads, -1).transpose(0, 2, 1, 3)
    Q, K, V = heads(project(x, "q")), heads(project(memory, "k")), heads(project(memory, "v"))
    logits = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(Q.shape[-1]) - 1e9 * key_masks[:, None, None, :]
    weights_ = np.exp(logits - logits.max(-1, keepdims=True))
    weights_ /= weights_.sum(-1, keepdims=True)
    concat = (weights_ @ V).transpose(0, 2, 1, 3).reshape(x.shape)
    residual = x + project(concat, "o")
    normalized = (residual - residual.mean(-1, keepdims=True)) / np.sqrt(residual.var(-1, keepdims=True) + 1e-6)
    return normalized * weights["ln/gamma"] + weights["ln/beta"]


def test_multihead_attention_equals_the_paper_in_numpy():
    rng = np.random.RandomState(1)
    x, memory = rng.randn(2, 3, 8).astype(np.float32), rng.randn(2, 4, 8).astype(np.float32)
    key_masks = np.array([[False, False, False, True], [False, False, False, False]])

    def build():
        outputs, _ = multihead_attention(tf.constant(x), tf.constant(memory), tf.constant(key_masks), num_heads=2,
                                         training=False, scope="attention")
        return outputs, {v.op.name[len("attention/"):]: v for v in tf1.global_variables()}
    outputs, weights = run_graph(build)
    np.testing.assert_allclose(outputs, numpy_multihead_attention(x, memory, key_masks, weights, 2), atol=1e-5)


def test_cached_self_attention_equals_causal_self_attention():
    """One position at a time over a cache of the keys and values before gives what the causal mask gives."""
    x = np.random.RandomState(2).randn(2, 4, 8).astype(np.float32)

    def build():
        whole, _ = multihead_attention(tf.constant(x), None, None, 2, training=False, causality=True)
        empty = tf.zeros([2, 2, 0, 4])
        cache, steps = {"keys": empty, "values": empty}, []
        for t in range(4):
            steps.append(multihead_attention(tf.constant(x[:, t:t + 1]), None, None, 2, training=False,
                                             cache=cache)[0])
        return whole, tf.concat(steps, axis=1)
    whole, stepwise = run_graph(build)
    np.testing.assert_allclose(stepwise, whole, atol=1e-5)


def test_dropout_zeroes_at_its_rate_and_scales_the_rest():
    dropped, kept = run_graph(lambda: (dropout(tf.ones([400, 500]), 0.1, training=True),
                                 dropout(tf.ones([3]), 0.1, training=False)))
    zero = dropped == 0
    assert abs(zero.mean() - 0.1) < 0.004  # 4 standard deviations of a binomial over 200,000 entries
    np.testing.assert_allclose(dropped[~zero], 1 / 0.9, rtol=1e-6)
    assert kept.tolist() == [1.0, 1.0, 1.0]


def test_feed_forward_drops_its_hidden_activations_at_their_own_rate():
    """relu_dropout acts on the (N, T, d_ff) hidden activations alone: with dropout_rate 0 the sublayer's output
    still changes in training, and with relu_dropout 0 training is inference (no dropout op at all: the graph and
    its random stream are those of a model without the flag)."""
    x = np.random.RandomState(0).randn(2, 5, 8).astype(np.float32)

    def train_minus_inference(relu_dropout):
        def build():
            tf1.set_random_seed(1)
            outputs = [ff(tf.constant(x), [16, 8], training=training, relu_dropout=relu_dropout)
                       for training in (True, False)]
            return outputs[0] - outputs[1]
        return np.abs(run_graph(build)).max()

    assert train_minus_inference(0.0) == 0.0
    assert train_minus_inference(0.5) > 1e-2


def test_padding_embedding_row_is_zero_and_gets_no_gradient():
    def build():
        embeddings = get_token_embeddings(5, 4)
        return embeddings, tf.gradients(tf.reduce_sum(embeddings), tf1.trainable_variables())[0]
    embeddings, grad = run_graph(build)
    assert not embeddings[0].any() and embeddings[1:].all()
    assert not grad[0].any() and (grad[1:] == 1).all()


def test_label_smoothing_three_classes():
    smoothed = run_graph(lambda: label_smoothing(tf.constant([[0., 0., 1.], [0., 1., 0.]]), epsilon=0.1))
    np.testing.assert_allclose(smoothed, [[0.03333334, 0.03333334, 0.93333334],
                                          [0.03333334, 0.93333334, 0.03333334]], rtol=1e-6)


@pytest.mark.parametrize("pos,i", [(0, 0), (0, 1), (1, 0), (1, 1), (7, 4), (7, 5), (50, 14), (123, 31)])
def test_positional_encoding_closed_form(pos, i):
    d_model = 32
    pe = run_graph(lambda: positional_encoding(tf.zeros([2, 130, d_model])))
    angle = pos / 10000 ** (2 * (i // 2) / d_model)
    expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    assert pe.shape == (1, 130, d_model)
    assert pe[0, pos, i] == pytest.approx(expected, abs=1e-5)


def test_positional_encoding_offset_continues_the_sequence():
    full, tail = run_graph(lambda: (positional_encoding(tf.zeros([1, 10, 8])),
                                    positional_encoding(tf.zeros([1, 3, 8]), 7)))
    np.testing.assert_allclose(tail[0], full[0, 7:10], atol=1e-6)


def test_ln_normalizes_each_position_before_gain_and_bias():
    inputs = np.random.RandomState(2).randn(2, 3, 16).astype(np.float32) * 5 + 3
    outputs = run_graph(lambda: ln(tf.constant(inputs)))  # gamma starts at 1 and beta at 0
    np.testing.assert_allclose(outputs.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(outputs.var(-1), 1.0, rtol=1e-3)


def test_noam_scheme_warms_up_linearly_peaks_then_decays_as_inverse_sqrt():
    steps = [100, 200, 400, 1600, 6400]
    lrs = run_graph(lambda: [noam_scheme(1e-3, s, warmup_steps=400) for s in steps])
    np.testing.assert_allclose(lrs[1] / lrs[0], 2.0, rtol=1e-6)  # linear rise
    assert lrs[2] == pytest.approx(1e-3, rel=1e-6)  # peak at warmup_steps
    assert max(lrs) == lrs[2]
    np.testing.assert_allclose([lrs[3] / lrs[2], lrs[4] / lrs[3]], [0.5, 0.5], rtol=1e-6)  # step^-0.5


@pytest.mark.parametrize("decay, expected_after_warmup", [
    # steps 600, 800, 1000 with warm-up 400 and total 1200: progress 1/4, 1/2, 3/4 of the decay
    ("linear", [0.75, 0.5, 0.25]),
    ("cosine", [0.5 * (1 + np.cos(np.pi / 4)), 0.5, 0.5 * (1 + np.cos(3 * np.pi / 4))]),
])
def test_warmup_decay_scheme_warms_up_then_reaches_zero_at_the_total(decay, expected_after_warmup):
    steps = [0, 100, 400, 600, 800, 1000, 1200, 5000]
    lrs = run_graph(lambda: [warmup_decay_scheme(2e-3, s, 400, 1200, decay) for s in steps])
    np.testing.assert_allclose(lrs[:3], [2e-3 / 400, 2e-3 / 4, 2e-3], rtol=1e-6)  # step 0 counts as step 1
    np.testing.assert_allclose(lrs[3:6], 2e-3 * np.array(expected_after_warmup), rtol=1e-5)
    assert lrs[6] == lrs[7] == 0.0


def test_warmup_decay_scheme_holds_the_peak_while_the_total_is_unknown():
    lrs = run_graph(lambda: [warmup_decay_scheme(1e-3, s, 100, 0) for s in [50, 100, 10_000]])
    np.testing.assert_allclose(lrs, [5e-4, 1e-3, 1e-3], rtol=1e-6)


def test_noam_cooldown_scheme_follows_noam_then_falls_linearly_to_zero_at_the_total():
    # warm-up 100, total 1000, cooldown 0.2: Noam up to step 800, then noam(800) * (1000 - step) / 200
    steps = [50, 100, 400, 800, 900, 950, 1000, 3000]
    lrs = run_graph(lambda: [noam_cooldown_scheme(1e-3, s, 100, 1000, 0.2) for s in steps])
    at_800 = 1e-3 * (100 / 800) ** 0.5
    np.testing.assert_allclose(lrs[:4], [5e-4, 1e-3, 5e-4, at_800], rtol=1e-5)
    np.testing.assert_allclose(lrs[4:6], [at_800 / 2, at_800 / 4], rtol=1e-5)
    assert lrs[6] == lrs[7] == 0.0


def test_noam_cooldown_scheme_is_noam_while_the_total_is_unknown():
    steps = [10, 100, 10_000]
    cooled, noam = run_graph(lambda: [[noam_cooldown_scheme(1e-3, s, 100, 0) for s in steps],
                                [noam_scheme(1e-3, s, 100) for s in steps]])
    np.testing.assert_allclose(cooled, noam, rtol=1e-6)
