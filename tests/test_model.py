"""The Transformer graph: causality, padding invariance, learning, stable variable names."""
import numpy as np
import pytest
import tensorflow as tf

from model_fixtures import build, random_ids, small_hp

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


@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_changing_a_later_target_token_leaves_earlier_outputs_unchanged(norm_type):
    rng = np.random.RandomState(0)
    hp = small_hp(norm_type=norm_type)
    x, y = random_ids(rng, [6, 4], hp.vocab_size), random_ids(rng, [7, 7], hp.vocab_size)
    y_changed = y.copy()
    y_changed[:, 3] = (y[:, 3] - 4 + 1) % (hp.vocab_size - 4) + 4  # decoder input position 4 changes
    before, after = decoder_logits(hp, x, y, False), decoder_logits(hp, x, y_changed, False)
    np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-5)
    assert np.abs(before[:, 4:] - after[:, 4:]).max() > 1e-3


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_appending_padding_leaves_real_positions_unchanged(training, norm_type):
    rng = np.random.RandomState(1)
    hp = small_hp(norm_type=norm_type, dropout_rate=0.0)
    x, y = random_ids(rng, [5, 3, 6], hp.vocab_size), random_ids(rng, [4, 6, 2], hp.vocab_size)
    padded_x, padded_y = np.pad(x, [[0, 0], [0, 7]]), np.pad(y, [[0, 0], [0, 5]])
    plain = decoder_logits(hp, x, y, training)
    padded = decoder_logits(hp, padded_x, padded_y, training)
    real = y != 0
    np.testing.assert_allclose(padded[:, :y.shape[1]][real], plain[real], atol=1e-5)


def test_overfits_a_tiny_batch():
    rng = np.random.RandomState(2)
    hp = small_hp()
    x, y = random_ids(rng, [6, 5, 7, 4], hp.vocab_size), random_ids(rng, [5, 7, 6, 3], hp.vocab_size)
    with tf.Graph().as_default():
        model, ph = build(hp)
        loss, train_op, _, _ = model.train(ph.xs, ph.ys)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            losses = [sess.run([loss, train_op], ph.feed(x, y))[0] for _ in range(300)]
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def expected_variables(d_model=32, d_ff=64, vocab_size=40):
    """name -> shape of every trainable variable of a 1-block model: the checkpoint format the README documents."""
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


def test_variable_names_are_stable():
    """Checkpoints restore across versions only if these names and shapes never change (README lists them)."""
    with tf.Graph().as_default():
        model, ph = build(small_hp(num_blocks=1))
        model.train(ph.xs, ph.ys)
        model.translate(ph.xs, beam_size=2)
        names = {v.name: v.shape.as_list() for v in tf1.trainable_variables()}
    assert names == expected_variables()
