"""fast/layers.py and fast/loss.py against modules.py's plain functions, closed forms and hand-computed values."""
import numpy as np
import pytest
import tensorflow as tf

import modules
from fast.layers import affine, dense, dropout, fused_heads, ln, ln_variables, self_attention, split_heads
from fast.loss import output_loss, smoothed_cross_entropy
from model_fixtures import fused_kernels, one_hot_smoothed_cross_entropy, run_graph

tf1 = tf.compat.v1


def test_dropout_rate_scale_gradient_and_seed():
    def build(seed):
        tf1.set_random_seed(seed)
        ones = tf.ones([601, 333])  # 200,133 entries: not a multiple of the 4 draws per random word
        dropped = dropout(ones, 0.1, training=True)
        return dropped, tf.gradients(tf.reduce_sum(3.0 * dropped), ones)[0], dropout(tf.ones([7, 3]), 0.5, True)
    (dropped, grad, small), (again, _, _), (other_seed, _, _) = (run_graph(lambda: build(seed)) for seed in (1, 1, 2))
    zero = dropped == 0
    assert abs(zero.mean() - 0.1) < 0.004  # 4 standard deviations of a binomial over 200,133 entries
    np.testing.assert_allclose(dropped[~zero], 1 / 0.9, rtol=1e-6)
    np.testing.assert_allclose(grad, 3.0 * dropped, rtol=1e-6)  # d/dx of 3 * x * mask / 0.9
    np.testing.assert_array_equal(dropped, again)
    assert (dropped != other_seed).mean() > 0.1 and set(np.unique(small)) <= {0.0, 2.0}
    assert run_graph(lambda: dropout(tf.ones([3]), 0.1, training=False)).tolist() == [1.0, 1.0, 1.0]


def attention_sublayer(path, x, dropout_rate, training, attention_dropout):
    """A self-attention sublayer of 2 heads on x by modules.py ("reference") or fast.layers ("fast", "fused")."""
    if path == "reference":
        return modules.multihead_attention(x, None, None, 2, dropout_rate, training,
                                           attention_dropout=attention_dropout)[0]
    return self_attention(x, None, 2, dropout_rate, training, fused_kernels=path == "fused",
                          attention_dropout=attention_dropout)[0]


@pytest.mark.parametrize("path", ["reference", "fast", "fused"])
def test_attention_sublayer_drops_its_weights_and_its_output_at_their_own_rates(path):
    """dropout_rate acts on the sublayer's output and attention_dropout on the attention weights: with both 0 the
    training output is the inference output, and either one alone changes it, on both paths."""
    if path == "fused":
        fused_kernels()
    x = np.random.RandomState(0).randn(2, 5, 8).astype(np.float32)

    def train_minus_inference(dropout_rate, attention_dropout):
        def build():
            tf1.set_random_seed(1)
            outputs = [attention_sublayer(path, tf.constant(x), dropout_rate, training, attention_dropout)
                       for training in (True, False)]
            return outputs[0] - outputs[1]
        return np.abs(run_graph(build)).max()

    assert train_minus_inference(0.0, 0.0) < 1e-6
    assert train_minus_inference(0.0, 0.5) > 1e-2
    assert train_minus_inference(0.5, 0.0) > 1e-2


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_bias_gradient_sums_in_float32_in_every_dtype(dtype):
    """4,096 rows of gradient 1 give each bias 4,096 (exact in bfloat16 too); a sum in bfloat16 stops at 256."""
    def build():
        bias = tf1.get_variable("bias", [3], initializer=tf1.zeros_initializer())
        outputs = affine(tf.ones([4096, 2]), tf.ones([2, 3]), bias, dtype)
        return tf.gradients(tf.reduce_sum(outputs), bias)[0]
    assert run_graph(build).tolist() == [4096.0] * 3


def test_lean_loss_and_its_gradient_equal_one_hot_label_smoothed_cross_entropy():
    rng = np.random.RandomState(1)
    logits, labels = (rng.randn(15, 11) * 4).astype(np.float32), rng.randint(0, 11, 15).astype(np.int32)

    def build():
        variable = tf.constant(logits)
        reference = one_hot_smoothed_cross_entropy(variable, labels, 11)
        lean, probs = smoothed_cross_entropy(variable, tf.constant(labels), tf.reduce_mean(variable, axis=-1), 0.1)
        return lean, reference, probs, tf.gradients(tf.reduce_sum(reference), variable)[0]
    lean, reference, probs, reference_grads = run_graph(build)
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
    lean, reference, lean_grads, reference_grads = run_graph(build)
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
    (bf16, fp32), (bf16_grad, fp32_grad) = run_graph(build)
    assert bf16.dtype == np.float32 and bf16_grad.dtype == np.float32
    np.testing.assert_allclose(bf16, fp32, rtol=1e-2)
    np.testing.assert_allclose(bf16_grad, fp32_grad, atol=2e-2 * np.abs(fp32_grad).max())


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

    fast, reference = run_graph(lambda: outputs_and_gradients(ln)), run_graph(lambda: outputs_and_gradients(modules.ln))
    for got, want in zip(fast, reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fused_heads_match_separate_projections_split_into_heads():
    inputs = np.random.RandomState(4).randn(3, 5, 12).astype(np.float32)

    def fused_and_separate():
        x = tf.constant(inputs)
        fused = fused_heads(x, 8, ("q", "k", "v"), num_heads=2)  # creates q, k and v
        separate = [split_heads(dense(x, 8, scope=scope), 2) for scope in ("q", "k", "v")]  # reuses them
        return fused, separate

    fused, separate = run_graph(fused_and_separate)
    assert [f.shape for f in fused] == [(6, 5, 4)] * 3  # (N*h, T, units/h)
    for got, want in zip(fused, separate):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)