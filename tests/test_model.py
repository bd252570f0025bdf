"""The Transformer graph on both paths (--impl reference and fast): causality, padding invariance, learning, the
same loss and gradients, stable variable names."""
import numpy as np
import pytest
import tensorflow as tf

from decoding import DecodingSettings, translate
from model import ModelConfig
from model_fixtures import (Placeholders, build, fused_kernels, one_hot_smoothed_cross_entropy, random_ids, small_hp,
                            train_step)
from fast import build_transformer

tf1 = tf.compat.v1


def decoder_logits(hp, x, y, training):
    """Logits (N, T2, V) for feeds x, y through encode + decode with fresh, fixed-seed weights."""
    with tf.Graph().as_default():
        model, ph = build(hp)
        memory, src_masks = model.encode(ph.xs, training=training)
        logits = model.decode(ph.ys, memory, src_masks, training=training)[0]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(logits, ph.feed(x, y))


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_changing_a_later_target_token_leaves_earlier_outputs_unchanged(norm_type, impl):
    rng = np.random.RandomState(0)
    hp = small_hp(norm_type=norm_type, impl=impl)
    x, y = random_ids(rng, [6, 4], hp.vocab_size), random_ids(rng, [7, 7], hp.vocab_size)
    y_changed = y.copy()
    y_changed[:, 3] = (y[:, 3] - 4 + 1) % (hp.vocab_size - 4) + 4  # decoder input position 4 changes
    before, after = decoder_logits(hp, x, y, False), decoder_logits(hp, x, y_changed, False)
    np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-5)
    assert np.abs(before[:, 4:] - after[:, 4:]).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("norm_type, training, impl", [("post", True, "reference"), ("pre", False, "reference"),
                                                       ("post", False, "fast"), ("pre", True, "fast")])
def test_appending_padding_leaves_real_positions_unchanged(norm_type, training, impl):
    """Each implementation with both layer-norm placements, in training and inference mode (no dropout)."""
    rng = np.random.RandomState(1)
    hp = small_hp(norm_type=norm_type, dropout_rate=0.0, impl=impl)
    x, y = random_ids(rng, [5, 3, 6], hp.vocab_size), random_ids(rng, [4, 6, 2], hp.vocab_size)
    padded_x, padded_y = np.pad(x, [[0, 0], [0, 7]]), np.pad(y, [[0, 0], [0, 5]])
    plain = decoder_logits(hp, x, y, training)
    padded = decoder_logits(hp, padded_x, padded_y, training)
    real = y != 0
    np.testing.assert_allclose(padded[:, :y.shape[1]][real], plain[real], atol=1e-5)


def train_on_a_tiny_batch(hp, steps):
    """Trains a fresh model `steps` times on one fixed batch of 4 pairs. Returns the losses and the final values of
    the graph's variables by name."""
    rng = np.random.RandomState(2)
    x, y = random_ids(rng, [6, 5, 7, 4], hp.vocab_size), random_ids(rng, [5, 7, 6, 3], hp.vocab_size)
    with tf.Graph().as_default():
        _, ph = build(hp)
        step = train_step(hp, ph)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            losses = [sess.run([step.batch["loss"], step.batch["update"]], ph.feed(x, y))[0] for _ in range(steps)]
            return losses, {v.name: value for v, value in zip(tf1.global_variables(),
                                                             sess.run(tf1.global_variables()))}


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_overfits_a_tiny_batch(impl):
    losses, _ = train_on_a_tiny_batch(small_hp(impl=impl), 300)
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def reference_and_fast_loss_and_gradients(fast_hp, x, y):
    """The training loss sum and the gradients of every variable, by the reference path (float32) and by the fast
    path of fast_hp, both models in one graph over the same variables (the same names: the second reuses them)."""
    with tf.Graph().as_default():
        tf1.set_random_seed(0)
        ph, outputs = Placeholders(), []
        for hp in (small_hp(**{**vars(fast_hp), "impl": "reference", "precision": "fp32"}), fast_hp):
            loss_sum, _, _ = build_transformer(ModelConfig.from_flags(hp)).loss(ph.xs, ph.ys)
            outputs.append([loss_sum, [tf.convert_to_tensor(g) for g in tf.gradients(loss_sum,
                                                                                      tf1.trainable_variables())]])
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(outputs, ph.feed(x, y))


@pytest.mark.parametrize("precision, kernels_, norm_type", [("fp32", "tf", "pre"), ("fp32", "fused", "post"),
                                                             ("bf16", "fused", "post"), ("bf16", "fused", "pre")])
def test_the_fast_path_gives_the_reference_loss_and_gradients(precision, kernels_, norm_type):
    """Without dropout the two implementations compute the same function: to float32 rounding in fp32, and within
    bfloat16's precision (a relative 1e-2 on the loss, gradients pointing the same way) in bf16. Each kernel set and
    each layer-norm placement is covered; bf16 (the fast path's default where the CPU has it) with both."""
    if kernels_ == "fused":
        fused_kernels()
    rng = np.random.RandomState(4)
    hp = small_hp(smoothing=0.1, precision=precision, kernels=kernels_, norm_type=norm_type)
    x, y = random_ids(rng, [6, 5, 7, 4], hp.vocab_size), random_ids(rng, [5, 7, 6, 3], hp.vocab_size, width=9)
    (reference_sum, reference_grads), (fast_sum, fast_grads) = reference_and_fast_loss_and_gradients(hp, x, y)
    if precision == "fp32":
        np.testing.assert_allclose(fast_sum, reference_sum, rtol=1e-5)
        for fast, reference in zip(fast_grads, reference_grads):
            np.testing.assert_allclose(fast, reference, atol=1e-5)
        return
    np.testing.assert_allclose(fast_sum, reference_sum, rtol=1e-2)
    flat = [np.concatenate([g.ravel() for g in grads]) for grads in (reference_grads, fast_grads)]
    assert flat[0] @ flat[1] / np.linalg.norm(flat[0]) / np.linalg.norm(flat[1]) > 0.99


def loss_and_gradients(hp, x, y, reference=False):
    """Training loss sum, token count and gradients of every variable for one batch, with fixed-seed weights.
    reference: score decode()'s full (N, T2, V) logits against materialized smoothed one-hot targets instead."""
    with tf.Graph().as_default():
        model, ph = build(hp)
        if reference:
            memory, src_masks = model.encode(ph.xs)
            logits, _, labels, _ = model.decode(ph.ys, memory, src_masks)
            nonpadding = tf.cast(tf.not_equal(labels, 0), tf.float32)
            loss_sum = tf.reduce_sum(
                nonpadding * one_hot_smoothed_cross_entropy(logits, labels, hp.vocab_size, hp.smoothing))
            token_count = tf.reduce_sum(nonpadding)
        else:
            loss_sum, token_count, _ = model.loss(ph.xs, ph.ys)
        gradients = tf.gradients(loss_sum, tf1.trainable_variables())
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run([loss_sum, token_count, gradients], ph.feed(x, y))


@pytest.fixture(scope="module")
def float32_loss():
    """A batch of 4 pairs (targets padded past their longest) and its float32 training loss sum, token count and
    gradients: (x, y, (loss_sum, token_count, gradients)), computed once for the tests that compare with it."""
    rng = np.random.RandomState(3)
    hp = small_hp(smoothing=0.1)
    x, y = random_ids(rng, [6, 5, 7, 4], hp.vocab_size), random_ids(rng, [5, 7, 6, 3], hp.vocab_size, width=9)
    return x, y, loss_and_gradients(hp, x, y)


@pytest.mark.slow
def test_training_loss_scores_real_tokens_in_chunks_like_the_full_one_hot_loss(float32_loss):
    x, y, (loss_sum, token_count, gradients) = float32_loss
    reference_sum, reference_count, reference_gradients = loss_and_gradients(small_hp(smoothing=0.1), x, y,
                                                                             reference=True)
    assert token_count == reference_count == 21
    np.testing.assert_allclose(loss_sum, reference_sum, rtol=1e-5)
    for gradient, reference in zip(gradients, reference_gradients):
        np.testing.assert_allclose(gradient, reference, atol=1e-5)


def loss_and_gradients_at(hp, x, y, weights=None):
    """Training loss sum and gradients of every variable for one batch, and the variables' values by name:
    the weights given (name -> value), else fixed-seed ones."""
    with tf.Graph().as_default():
        model, ph = build(hp)
        loss_sum, _, _ = model.loss(ph.xs, ph.ys)
        gradients = tf.gradients(loss_sum, tf1.trainable_variables())
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for variable in tf1.global_variables():
                if weights is not None:
                    variable.load(weights[variable.name], sess)
            values = {v.name: value for v, value in zip(tf1.global_variables(), sess.run(tf1.global_variables()))}
            return sess.run([loss_sum, gradients], ph.feed(x, y)) + [values]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_kernels_give_the_training_loss_and_gradients_of_tensorflow_ops(precision):
    """Without dropout the fused residual + layer norm is the same function as TensorFlow's ops (fast/kernels.py)."""
    fused_kernels()
    rng = np.random.RandomState(3)
    hp = small_hp(smoothing=0.1, precision=precision)
    x, y = random_ids(rng, [6, 5, 7, 4], hp.vocab_size), random_ids(rng, [5, 7, 6, 3], hp.vocab_size, width=9)
    ops_sum, ops_gradients, weights = loss_and_gradients_at(hp, x, y)
    fused_sum, fused_gradients, _ = loss_and_gradients_at(small_hp(smoothing=0.1, precision=precision,
                                                                   kernels="fused"), x, y, weights)
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(fused_sum, ops_sum, rtol=tolerance)
    for fused, ops in zip(fused_gradients, ops_gradients):
        np.testing.assert_allclose(fused, ops, atol=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_loss_and_gradients_track_float32(float32_loss, precision):
    x, y, (fp32_sum, _, fp32_gradients) = float32_loss
    mixed_sum, _, mixed_gradients = loss_and_gradients(small_hp(smoothing=0.1, precision=precision), x, y)
    np.testing.assert_allclose(mixed_sum, fp32_sum, rtol=1e-2)
    flat = [np.concatenate([g.ravel() for g in gradients]) for gradients in (fp32_gradients, mixed_gradients)]
    cosine = flat[0] @ flat[1] / np.linalg.norm(flat[0]) / np.linalg.norm(flat[1])
    assert cosine > 0.99, cosine
    assert all(g.dtype == np.float32 for g in mixed_gradients)


@pytest.mark.slow
def test_float16_training_scales_the_loss_and_learns():
    losses, variables = train_on_a_tiny_batch(small_hp(precision="fp16"), 60)
    scale = variables["current_loss_scale:0"]
    assert scale >= 2 ** 10, scale  # dynamic loss scaling starts at 2^15 and halves only on overflow
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


def expected_variables(d_model=32, d_ff=64, vocab_size=40):
    """name -> shape of every trainable variable of a 1-block model: the checkpoint format
    of docs/checkpoint-format.md."""
    ln = {"ln/gamma": [d_model], "ln/beta": [d_model]}
    attention = {**ln, **{"%s/%s" % (p, v): ([d_model, d_model] if v == "kernel" else [d_model])
                          for p in "qkvo" for v in ("kernel", "bias")}}
    feedforward = {**ln, "inner/kernel": [d_model, d_ff], "inner/bias": [d_ff],
                   "outer/kernel": [d_ff, d_model], "outer/bias": [d_model]}
    sublayers = {"encoder/num_blocks_0/multihead_attention": attention,
                 "encoder/num_blocks_0/positionwise_feedforward": feedforward,
                 "decoder/num_blocks_0/self_attention": attention,
                 "decoder/num_blocks_0/vanilla_attention": attention,
                 "decoder/num_blocks_0/positionwise_feedforward": feedforward}
    names = {"%s/%s:0" % (scope, name): shape for scope, table in sublayers.items() for name, shape in table.items()}
    names["shared_weight_matrix/weight_mat:0"] = [vocab_size, d_model]
    return names


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_variable_names_are_stable(impl):
    """Checkpoints restore across versions, and move between the implementations, only if these names and shapes
    never change (docs/checkpoint-format.md lists them)."""
    with tf.Graph().as_default():
        hp = small_hp(num_blocks=1, impl=impl)
        model, ph = build(hp)
        train_step(hp, ph)
        translate(model, ph.xs, DecodingSettings(beam_size=2))
        names = {v.name: v.shape.as_list() for v in tf1.trainable_variables()}
    assert names == expected_variables()
