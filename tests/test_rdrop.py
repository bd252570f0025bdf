"""R-Drop (--rdrop ALPHA; Liang et al., 2021): the symmetric KL against numpy, the loss of each
--impl against the formula on its own two passes' logits, the two paths alike, a run's loss falling,
and --rdrop 0 the graph and the losses of a run without the flag."""
import numpy as np
import pytest
import tensorflow as tf

import fast.model
import model
import train
from fast import build_transformer
from fast.loss import rdrop_output_loss
from in_process import run_in_process
from model import ModelConfig, symmetric_kl
from model_fixtures import Placeholders, fused_kernels, random_ids, small_hp, train_step
from test_impl import TINY_MODEL, losses

tf1 = tf.compat.v1

EPSILON = 0.1  # the label smoothing of the tests


def batch(rng, vocab_size):
    """4 pairs of various lengths: x (4, 7), y (4, 9)."""
    return (random_ids(rng, [6, 5, 7, 4], vocab_size),
            random_ids(rng, [5, 7, 6, 3], vocab_size, width=9))


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def numpy_symmetric_kl(logits1, logits2):
    """(KL(p1 || p2) + KL(p2 || p1)) / 2 over the last axis, from the definition."""
    log_p1, log_p2 = log_softmax(logits1), log_softmax(logits2)
    p1, p2 = np.exp(log_p1), np.exp(log_p2)
    return ((p1 * (log_p1 - log_p2)).sum(-1) + (p2 * (log_p2 - log_p1)).sum(-1)) / 2


def numpy_rdrop_sum(logits1, logits2, labels, alpha):
    """The summed R-Drop loss of model.Transformer.rdrop_loss's docstring: per token
    (CE1 + CE2 + alpha KL_sym) / 2. logits1, logits2: (M, V) of the M non-pad tokens' two passes;
    labels (M,)."""
    vocab_size = logits1.shape[-1]
    targets = (1 - EPSILON) * np.eye(vocab_size)[labels] + EPSILON / vocab_size  # (M, V)
    ce1, ce2 = (-(targets * log_softmax(logits)).sum(-1) for logits in (logits1, logits2))
    return ((ce1 + ce2 + alpha * numpy_symmetric_kl(logits1, logits2)) / 2).sum()


def test_the_symmetric_kl_against_hand_computed_values():
    """p1 = (1/2, 1/2), p2 = (3/4, 1/4): KL(p1 || p2) = ln(4/3) / 2 = 0.14384 and
    KL(p2 || p1) = 3/4 ln(3/2) - 1/4 ln 2 = 0.13081, their mean 0.13733; equal logits (or logits a
    constant apart): 0."""
    logits1 = np.array([[0.0, 0.0], [1.0, 2.0]], np.float32)
    logits2 = np.array([[np.log(3.0), 0.0], [3.0, 4.0]], np.float32)
    expected = [(np.log(4 / 3) / 2 + 0.75 * np.log(1.5) - 0.25 * np.log(2)) / 2, 0.0]
    rng = np.random.RandomState(0)
    random1, random2 = rng.randn(2, 3, 7).astype(np.float32) * 3
    with tf.Graph().as_default(), tf1.Session() as sess:
        hand, random = sess.run([symmetric_kl(logits1, logits2), symmetric_kl(random1, random2)])
    np.testing.assert_allclose(hand, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(random, numpy_symmetric_kl(random1, random2), rtol=1e-5)
    assert hand[0] == pytest.approx(0.13733, abs=1e-5) and (random > 0).all()


def rdrop_run(hp, x, y, monkeypatch):
    """The R-Drop loss sum of hp's model on the batch x, y, and the logits of the two passes that
    went into its KL term, in one session run: on the reference path symmetric_kl's arguments, on
    the fast path the two passes' rows given to rdrop_output_loss times the output projection."""
    recorded = []

    def recording_kl(logits1, logits2):
        recorded.extend([logits1, logits2])
        return symmetric_kl(logits1, logits2)

    def recording_loss(hidden1, hidden2, embeddings, *args, **kwargs):
        recorded.extend(tf.matmul(hidden, embeddings, transpose_b=True)
                        for hidden in (hidden1, hidden2))
        return rdrop_output_loss(hidden1, hidden2, embeddings, *args, **kwargs)
    monkeypatch.setattr(model, "symmetric_kl", recording_kl)
    monkeypatch.setattr(fast.model, "rdrop_output_loss", recording_loss)
    with tf.Graph().as_default():
        tf1.set_random_seed(0)
        ph = Placeholders()
        loss_sum, tokens, _ = build_transformer(ModelConfig.from_flags(hp)).loss(ph.xs, ph.ys)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run([loss_sum, tokens] + recorded, ph.feed(x, y))


@pytest.mark.parametrize("impl, kernels", [("reference", "tf"), ("fast", "tf"),
                                           ("fast", "fused")])
def test_the_loss_is_the_formula_on_the_two_passes_logits(impl, kernels, monkeypatch):
    """With dropout the two passes differ (the KL term is positive), and the loss is the formula
    applied to the logits they gave, whatever dropout drew; the tokens are counted once."""
    if kernels == "fused":
        fused_kernels()
    hp = small_hp(impl=impl, kernels=kernels, dropout_rate=0.3, smoothing=EPSILON, rdrop=2.0)
    x, y = batch(np.random.RandomState(4), hp.vocab_size)
    loss_sum, tokens, logits1, logits2 = rdrop_run(hp, x, y, monkeypatch)
    labels = y[y != 0]
    if impl == "reference":  # (N, T2, V): the non-pad tokens' rows, as the fast path keeps them
        logits1, logits2 = logits1[y != 0], logits2[y != 0]
    assert tokens == len(labels) == logits1.shape[0] == logits2.shape[0]
    assert numpy_symmetric_kl(logits1, logits2).mean() > 1e-3  # two different masks
    np.testing.assert_allclose(loss_sum, numpy_rdrop_sum(logits1, logits2, labels, 2.0),
                               rtol=1e-5)


@pytest.mark.parametrize("rows, chunk_rows", [(7, 4), (6, 4), (2, 8)])
def test_the_chunked_loss_and_its_gradients_equal_the_formula_differentiated(rows, chunk_rows):
    """rdrop_output_loss (the fast path's, with its gradient written out) against the formula on
    the full logits, differentiated by TensorFlow: two different passes, so that the KL term's
    gradient counts; rows that fill the chunks and rows that leave padding."""
    rng = np.random.RandomState(rows)
    hidden1, hidden2 = rng.randn(2, rows, 6).astype(np.float32)
    embeddings = rng.randn(9, 6).astype(np.float32)
    labels = rng.randint(0, 9, rows).astype(np.int32)
    targets = (1 - EPSILON) * np.eye(9, dtype=np.float32)[labels] + EPSILON / 9
    with tf.Graph().as_default(), tf1.Session() as sess:
        h1, h2, e = (tf.constant(a) for a in (hidden1, hidden2, embeddings))
        chunked = 3.0 * rdrop_output_loss(h1, h2, e, tf.constant(labels), 2.0, EPSILON,
                                          chunk_rows=chunk_rows)  # upstream gradient 3
        logits1, logits2 = (tf.matmul(h, e, transpose_b=True) for h in (h1, h2))
        cross_entropy = sum(tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)
                            for logits in (logits1, logits2))
        formula = 3.0 * tf.reduce_sum(cross_entropy + 2.0 * symmetric_kl(logits1, logits2))
        (chunked, chunked_grads), (formula, formula_grads) = sess.run(
            [(loss, tf.gradients(loss, [h1, h2, e])) for loss in (chunked, formula)])
    numpy_sum = numpy_rdrop_sum(hidden1 @ embeddings.T, hidden2 @ embeddings.T, labels, 2.0)
    assert formula == pytest.approx(2 * 3.0 * numpy_sum, rel=1e-5)  # numpy's is halved
    np.testing.assert_allclose(chunked, formula, rtol=1e-5)
    for chunked_grad, formula_grad in zip(chunked_grads, formula_grads):
        np.testing.assert_allclose(chunked_grad, formula_grad, atol=1e-5)


def loss_and_gradients(hps, x, y):
    """Each of hps' loss sum and gradients of every variable, all the models in one graph over the
    same variables (the ones after the first reuse them)."""
    with tf.Graph().as_default():
        tf1.set_random_seed(0)
        ph, outputs = Placeholders(), []
        for hp in hps:
            loss_sum, _, _ = build_transformer(ModelConfig.from_flags(hp)).loss(ph.xs, ph.ys)
            grads = tf.gradients(loss_sum, tf1.trainable_variables())
            outputs.append([loss_sum, [tf.convert_to_tensor(g) for g in grads]])
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(outputs, ph.feed(x, y))


@pytest.mark.parametrize("kernels", ["tf", "fused"])
def test_without_dropout_both_paths_give_the_cross_entropy_and_its_gradients(kernels):
    """Dropout 0: the two passes are one, KL and its gradient are 0, and R-Drop's loss (the two
    passes' cross entropy averaged) is the plain loss, on both paths alike."""
    if kernels == "fused":
        fused_kernels()
    common = dict(smoothing=EPSILON, dropout_rate=0.0)
    hps = [small_hp(impl="reference", **common), small_hp(impl="reference", rdrop=5.0, **common),
           small_hp(impl="fast", kernels=kernels, rdrop=5.0, **common)]
    x, y = batch(np.random.RandomState(5), hps[0].vocab_size)
    (plain, plain_grads), *rdrops = loss_and_gradients(hps, x, y)
    for loss_sum, grads in rdrops:
        np.testing.assert_allclose(loss_sum, plain, rtol=1e-5)
        for grad, plain_grad in zip(grads, plain_grads):
            np.testing.assert_allclose(grad, plain_grad, atol=1e-5)


def three_steps(hp, x, y):
    """The graph of train.py's step for hp, each node's name, op and inputs (its attributes name
    functions and custom gradients by a counter of the process), and the losses of 3 steps on x,
    y."""
    with tf.Graph().as_default() as graph:
        tf1.set_random_seed(0)
        ph = Placeholders()
        step = train_step(hp, ph)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            steps = [sess.run([step.batch["loss"], step.batch["update"]], ph.feed(x, y))[0]
                     for _ in range(3)]
    return [(node.name, node.op, list(node.input)) for node in graph.as_graph_def().node], steps


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_rdrop_0_builds_the_graph_and_the_losses_of_a_run_without_it(impl):
    hp = dict(impl=impl, dropout_rate=0.2, smoothing=EPSILON)
    x, y = batch(np.random.RandomState(6), small_hp().vocab_size)
    without, without_losses = three_steps(small_hp(**hp), x, y)  # small_hp has no rdrop
    off, off_losses = three_steps(small_hp(rdrop=0.0, **hp), x, y)
    assert off == without and off_losses == without_losses
    on, on_losses = three_steps(small_hp(rdrop=1.0, **hp), x, y)
    assert len(on) > len(without) and on_losses != without_losses


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_a_run_with_rdrop_1_lowers_its_loss(impl, small_numbers_dir, tmp_path, capsys):
    code, out, err = run_in_process(capsys, "train.py", train.main, "--data_dir",
                                    small_numbers_dir, "--logdir", str(tmp_path / "run"),
                                    "--max_steps", "30", "--impl", impl, "--rdrop", "1",
                                    "--dropout_rate", "0.1", "--kernels", "tf", *TINY_MODEL)
    assert code == 0, err
    printed = losses(out)
    assert len(printed) >= 3 and printed[-1] < 0.9 * printed[0], printed
    assert all(later < earlier for earlier, later in zip(printed, printed[1:])), printed


def test_a_negative_alpha_is_refused(tmp_path, capsys):
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", str(tmp_path / "r"),
                                  "--rdrop", "-1")
    assert code != 0 and "--rdrop -1.0 is out of range: it must be at least 0" in err
