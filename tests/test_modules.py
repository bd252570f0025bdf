"""modules.py against hand-computed values and closed forms."""
import math

import numpy as np
import pytest
import tensorflow as tf

import kernels
from model_fixtures import one_hot_smoothed_cross_entropy
from loss import output_loss, smoothed_cross_entropy
from modules import (affine, dense, dropout, ff, fused_heads, get_token_embeddings, label_smoothing, ln, ln_reference,
                     ln_variables, noam_cooldown_scheme, noam_scheme, positional_encoding,
                     scaled_dot_product_attention, self_attention, split_heads, warmup_decay_scheme)

tf1 = tf.compat.v1


def run(build):
    """Builds tensors with build() in a fresh graph, initializes variables and returns their values."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        tensors = build()
        sess.run(tf1.global_variables_initializer())
        return sess.run(tensors)


def test_scaled_dot_product_attention_hand_computed():
    q = [[0., 1., 0.], [0., 0., 1.]]
    k = [[1., 2., 0.], [0., 1., 1.]]
    v = [[1., 0.], [2., 0.]]
    outputs, weights = run(lambda: scaled_dot_product_attention(
        tf.constant([q, q]), tf.constant([k, k]), tf.constant([v, v]), tf.zeros([2, 2], tf.bool), training=False))
    for batch in range(2):
        np.testing.assert_allclose(weights[batch], [[0.64045745, 0.35954252], [0.35954252, 0.64045745]], rtol=1e-6)
        np.testing.assert_allclose(outputs[batch], [[1.3595425, 0.], [1.6404574, 0.]], rtol=1e-6)


def test_key_mask_and_causality_zero_the_right_weights():
    q = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    key_masks = np.array([[False, False, True], [False, False, False]])
    _, key_weights = run(lambda: scaled_dot_product_attention(q, q, q, tf.constant(key_masks), training=False))
    _, future_weights = run(lambda: scaled_dot_product_attention(q, q, q, None, causality=True, training=False))
    assert np.all(key_weights[0, :, 2] == 0) and np.all(key_weights[1] > 0)
    np.testing.assert_allclose(key_weights.sum(-1), 1.0, rtol=1e-6)
    lower = np.tril(np.ones((3, 3), bool))
    assert np.all(future_weights[0][~lower] == 0) and np.all(future_weights[0][lower] > 0)


def test_dropout_rate_scale_gradient_and_seed():
    def build(seed):
        tf1.set_random_seed(seed)
        ones = tf.ones([601, 333])  # 200,133 entries: not a multiple of the 4 draws per random word
        dropped = dropout(ones, 0.1, training=True)
        return dropped, tf.gradients(tf.reduce_sum(3.0 * dropped), ones)[0], dropout(tf.ones([7, 3]), 0.5, True)
    (dropped, grad, small), (again, _, _), (other_seed, _, _) = run(lambda: build(1)), run(lambda: build(1)), \
        run(lambda: build(2))
    zero = dropped == 0
    assert abs(zero.mean() - 0.1) < 0.004  # 4 standard deviations of a binomial over 200,133 entries
    np.testing.assert_allclose(dropped[~zero], 1 / 0.9, rtol=1e-6)
    np.testing.assert_allclose(grad, 3.0 * dropped, rtol=1e-6)  # d/dx of 3 * x * mask / 0.9
    np.testing.assert_array_equal(dropped, again)
    assert (dropped != other_seed).mean() > 0.1 and set(np.unique(small)) <= {0.0, 2.0}
    assert run(lambda: dropout(tf.ones([3]), 0.1, training=False)).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("fused_kernels", [False, True])
def test_attention_sublayer_drops_its_weights_and_its_output_at_their_own_rates(fused_kernels):
    """dropout_rate acts on the sublayer's output and attention_dropout on the attention weights: with both 0 the
    training output is the inference output, and either one alone changes it."""
    if fused_kernels:
        try:
            kernels.load()
        except kernels.KernelsUnavailable as e:
            pytest.skip(str(e))
    x = np.random.RandomState(0).randn(2, 5, 8).astype(np.float32)

    def train_minus_inference(dropout_rate, attention_dropout):
        def build():
            tf1.set_random_seed(1)
            outputs = [self_attention(tf.constant(x), None, 2, dropout_rate, training, fused_kernels=fused_kernels,
                                      attention_dropout=attention_dropout)[0] for training in (True, False)]
            return outputs[0] - outputs[1]
        return np.abs(run(build)).max()

    assert train_minus_inference(0.0, 0.0) < 1e-6
    assert train_minus_inference(0.0, 0.5) > 1e-2
    assert train_minus_inference(0.5, 0.0) > 1e-2


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
        return np.abs(run(build)).max()

    assert train_minus_inference(0.0) == 0.0
    assert train_minus_inference(0.5) > 1e-2


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_bias_gradient_sums_in_float32_in_every_dtype(dtype):
    """4,096 rows of gradient 1 give each bias 4,096 (exact in bfloat16 too); a sum in bfloat16 stops at 256."""
    def build():
        bias = tf1.get_variable("bias", [3], initializer=tf1.zeros_initializer())
        outputs = affine(tf.ones([4096, 2]), tf.ones([2, 3]), bias, dtype)
        return tf.gradients(tf.reduce_sum(outputs), bias)[0]
    assert run(build).tolist() == [4096.0] * 3


def test_padding_embedding_row_is_zero_and_gets_no_gradient():
    def build():
        embeddings = get_token_embeddings(5, 4)
        return embeddings, tf.gradients(tf.reduce_sum(embeddings), tf1.trainable_variables())[0]
    embeddings, grad = run(build)
    assert not embeddings[0].any() and embeddings[1:].all()
    assert not grad[0].any() and (grad[1:] == 1).all()


def test_label_smoothing_three_classes():
    smoothed = run(lambda: label_smoothing(tf.constant([[0., 0., 1.], [0., 1., 0.]]), epsilon=0.1))
    np.testing.assert_allclose(smoothed, [[0.03333334, 0.03333334, 0.93333334],
                                          [0.03333334, 0.93333334, 0.03333334]], rtol=1e-6)


def test_lean_loss_and_its_gradient_equal_one_hot_label_smoothed_cross_entropy():
    rng = np.random.RandomState(1)
    logits, labels = (rng.randn(15, 11) * 4).astype(np.float32), rng.randint(0, 11, 15).astype(np.int32)

    def build():
        variable = tf.constant(logits)
        reference = one_hot_smoothed_cross_entropy(variable, labels, 11)
        lean, probs = smoothed_cross_entropy(variable, tf.constant(labels), tf.reduce_mean(variable, axis=-1), 0.1)
        return lean, reference, probs, tf.gradients(tf.reduce_sum(reference), variable)[0]
    lean, reference, probs, reference_grads = run(build)
    np.testing.assert_allclose(lean, reference, atol=1e-5)
    # the gradient is p - (1 - epsilon) one_hot - epsilon / V, of which the function returns p
    lean_grads = probs - 0.9 * np.eye(11, dtype=np.float32)[labels] - 0.1 / 11
    np.testing.assert_allclose(lean_grads, reference_grads, atol=1e-6)


@pytest.mark.parametrize("rows,chunk_rows", [(13, 4), (12, 4), (3, 8), (0, 4)])
def test_chunked_output_loss_and_gradients_equal_one_hot_reference(rows, chunk_rows):
    rng = np.random.RandomState(rows)
    hidden, embeddings = rng.randn(rows, 6).astype(np.float32), rng.randn(9, 6).astype(np.float32)
    labels = rng.randint(0, 9, rows).astype(np.int32)

    def build():
        h, e = tf.constant(hidden), tf.constant(embeddings)
        lean = 3.0 * output_loss(h, e, tf.constant(labels), 0.1, chunk_rows=chunk_rows)  # upstream gradient 3
        reference = 3.0 * tf.reduce_sum(
            one_hot_smoothed_cross_entropy(tf.matmul(h, e, transpose_b=True), labels, 9))
        return lean, reference, tf.gradients(lean, [h, e]), tf.gradients(reference, [h, e])
    lean, reference, lean_grads, reference_grads = run(build)
    np.testing.assert_allclose(lean, reference, rtol=1e-6, atol=1e-5)
    for lean_grad, reference_grad in zip(lean_grads, reference_grads):
        np.testing.assert_allclose(lean_grad, reference_grad, atol=1e-5)


def test_chunked_output_loss_in_bfloat16_stays_close_to_float32():
    rng = np.random.RandomState(5)
    hidden, embeddings = rng.randn(10, 16).astype(np.float32), rng.randn(7, 16).astype(np.float32) * 0.25
    labels = rng.randint(0, 7, 10).astype(np.int32)

    def build():
        h, e = tf.constant(hidden), tf.constant(embeddings)
        losses = [output_loss(h, e, tf.constant(labels), 0.1, dtype, chunk_rows=4)
                  for dtype in (tf.bfloat16, tf.float32)]
        return losses, [tf.gradients(loss, h)[0] for loss in losses]
    (bf16, fp32), (bf16_grad, fp32_grad) = run(build)
    assert bf16.dtype == np.float32 and bf16_grad.dtype == np.float32
    np.testing.assert_allclose(bf16, fp32, rtol=1e-2)
    np.testing.assert_allclose(bf16_grad, fp32_grad, atol=2e-2 * np.abs(fp32_grad).max())


@pytest.mark.parametrize("pos,i", [(0, 0), (0, 1), (1, 0), (1, 1), (7, 4), (7, 5), (50, 14), (123, 31)])
def test_positional_encoding_closed_form(pos, i):
    d_model = 32
    pe = run(lambda: positional_encoding(tf.zeros([2, 130, d_model])))
    angle = pos / 10000 ** (2 * (i // 2) / d_model)
    expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    assert pe.shape == (1, 130, d_model)
    assert pe[0, pos, i] == pytest.approx(expected, abs=1e-5)


def test_positional_encoding_offset_continues_the_sequence():
    full, tail = run(lambda: (positional_encoding(tf.zeros([1, 10, 8])), positional_encoding(tf.zeros([1, 3, 8]), 7)))
    np.testing.assert_allclose(tail[0], full[0, 7:10], atol=1e-6)


def test_ln_normalizes_each_position_before_gain_and_bias():
    inputs = np.random.RandomState(2).randn(2, 3, 16).astype(np.float32) * 5 + 3
    outputs = run(lambda: ln(tf.constant(inputs)))  # gamma starts at 1 and beta at 0
    np.testing.assert_allclose(outputs.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(outputs.var(-1), 1.0, rtol=1e-3)


@pytest.mark.parametrize("shape", [(2, 3, 16), (5, 16)])
def test_ln_written_out_gradient_matches_automatic_differentiation(shape):
    rng = np.random.RandomState(3)
    inputs = (rng.randn(*shape) * 4 + 2).astype(np.float32)
    upstream = rng.randn(*shape).astype(np.float32)  # a gradient that differs from position to position
    gain, bias = (rng.rand(shape[-1]) + 0.5).astype(np.float32), rng.randn(shape[-1]).astype(np.float32)

    def outputs_and_gradients(layer_norm):
        x = tf.constant(inputs)
        with tf1.variable_scope("ln"):
            gamma, beta = ln_variables(shape[-1])
        with tf.control_dependencies([gamma.assign(gain), beta.assign(bias)]):  # not the initial 1 and 0
            y = layer_norm(x)
        return [y] + tf.gradients(y, [x, gamma, beta], grad_ys=upstream)

    fast, reference = run(lambda: outputs_and_gradients(ln)), run(lambda: outputs_and_gradients(ln_reference))
    for got, want in zip(fast, reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fused_heads_match_separate_projections_split_into_heads():
    inputs = np.random.RandomState(4).randn(3, 5, 12).astype(np.float32)

    def fused_and_separate():
        x = tf.constant(inputs)
        fused = fused_heads(x, 8, ("q", "k", "v"), num_heads=2)  # creates q, k and v
        separate = [split_heads(dense(x, 8, scope=scope), 2) for scope in ("q", "k", "v")]  # reuses them
        return fused, separate

    fused, separate = run(fused_and_separate)
    assert [f.shape for f in fused] == [(6, 5, 4)] * 3  # (N*h, T, units/h)
    for got, want in zip(fused, separate):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_noam_scheme_warms_up_linearly_peaks_then_decays_as_inverse_sqrt():
    steps = [100, 200, 400, 1600, 6400]
    lrs = run(lambda: [noam_scheme(1e-3, s, warmup_steps=400) for s in steps])
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
    lrs = run(lambda: [warmup_decay_scheme(2e-3, s, 400, 1200, decay) for s in steps])
    np.testing.assert_allclose(lrs[:3], [2e-3 / 400, 2e-3 / 4, 2e-3], rtol=1e-6)  # step 0 counts as step 1
    np.testing.assert_allclose(lrs[3:6], 2e-3 * np.array(expected_after_warmup), rtol=1e-5)
    assert lrs[6] == lrs[7] == 0.0


def test_warmup_decay_scheme_holds_the_peak_while_the_total_is_unknown():
    lrs = run(lambda: [warmup_decay_scheme(1e-3, s, 100, 0) for s in [50, 100, 10_000]])
    np.testing.assert_allclose(lrs, [5e-4, 1e-3, 1e-3], rtol=1e-6)


def test_noam_cooldown_scheme_follows_noam_then_falls_linearly_to_zero_at_the_total():
    # warm-up 100, total 1000, cooldown 0.2: Noam up to step 800, then noam(800) * (1000 - step) / 200
    steps = [50, 100, 400, 800, 900, 950, 1000, 3000]
    lrs = run(lambda: [noam_cooldown_scheme(1e-3, s, 100, 1000, 0.2) for s in steps])
    at_800 = 1e-3 * (100 / 800) ** 0.5
    np.testing.assert_allclose(lrs[:4], [5e-4, 1e-3, 5e-4, at_800], rtol=1e-5)
    np.testing.assert_allclose(lrs[4:6], [at_800 / 2, at_800 / 4], rtol=1e-5)
    assert lrs[6] == lrs[7] == 0.0


def test_noam_cooldown_scheme_is_noam_while_the_total_is_unknown():
    steps = [10, 100, 10_000]
    cooled, noam = run(lambda: [[noam_cooldown_scheme(1e-3, s, 100, 0) for s in steps],
                                [noam_scheme(1e-3, s, 100) for s in steps]])
    np.testing.assert_allclose(cooled, noam, rtol=1e-6)
