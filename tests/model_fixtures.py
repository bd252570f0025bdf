"""Small models, random batches and the one-hot reference loss shared by the tests."""
import os
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from toolkit.training import distributed
from toolkit.training.step import build_step
from data_load import Sources, Targets
from fast import kernels
from model import BOS_ID, EOS_ID, ModelConfig
from fast import build_transformer
from modules import label_smoothing

tf1 = tf.compat.v1

#: The source limit of the tiny trained model that tests share (conftest.py tiny_model): 19 pieces and </s>.
TINY_MODEL_MAXLEN1 = 20

SMALL = dict(vocab_size=40, d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0, attention_dropout=None,
             relu_dropout=0.0, norm_type="post", smoothing=0.0, lr=3e-3, lr_schedule="noam", warmup_steps=50,
             impl="fast", precision="fp32", kernels="tf", accum_steps=1, rdrop=0.0)


def small_hp(**overrides):
    return SimpleNamespace(**{**SMALL, **overrides})


def random_ids(rng, lengths, vocab_size, width=None):
    """(N, width) ids in [4, V) ending in </s> at each length, padded with 0."""
    width = width or max(lengths)
    ids = np.zeros([len(lengths), width], np.int32)
    for row, length in zip(ids, lengths):
        row[:length - 1] = rng.randint(4, vocab_size, length - 1)
        row[length - 1] = EOS_ID
    return ids


def shift_right(y):
    """Decoder input for targets y (N, T): <s> followed by y without its last column; pads stay 0 after </s>."""
    return np.concatenate([np.full([len(y), 1], BOS_ID, np.int32), y[:, :-1]], 1) * (y != 0)


class Placeholders:
    """Batch placeholders in the data pipeline's layout, and a helper to feed numpy arrays into them."""

    def __init__(self):
        self.x = tf1.placeholder(tf.int32, [None, None])
        self.x_seqlen = tf1.placeholder(tf.int32, [None])
        self.decoder_input = tf1.placeholder(tf.int32, [None, None])
        self.y = tf1.placeholder(tf.int32, [None, None])
        self.xs = Sources(self.x, self.x_seqlen)
        self.ys = Targets(self.decoder_input, self.y, tf.reduce_sum(tf.sign(self.y), 1))

    def feed(self, x, y=None):
        feed = {self.x: x, self.x_seqlen: (x != 0).sum(1)}
        if y is not None:
            feed.update({self.y: y, self.decoder_input: shift_right(y)})
        return feed


def build(hp):
    """A model over placeholders in a new default graph (the caller enters graph.as_default())."""
    tf1.set_random_seed(0)
    return build_transformer(ModelConfig.from_flags(hp)), Placeholders()


def run_graph(build_fn):
    """Builds tensors with build_fn() in a fresh graph, initializes variables and returns their values."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        tensors = build_fn()
        sess.run(tf1.global_variables_initializer())
        return sess.run(tensors)


def train_step(hp, ph):
    """train.py's training step (--distribute none) over the placeholders ph: a step.TrainStep."""
    cluster = distributed.make_cluster(SimpleNamespace(distribute="none"), tf1.ConfigProto())
    return build_step(hp, ph.xs, ph.ys, cluster)


def one_hot_smoothed_cross_entropy(logits, labels, vocab_size, epsilon=0.1):
    """The reference loss: softmax cross entropy against materialized (..., V) smoothed one-hot targets."""
    return tf.nn.softmax_cross_entropy_with_logits(
        labels=label_smoothing(tf.one_hot(labels, vocab_size), epsilon), logits=logits)


def fused_kernels():
    """The fused kernels' op library, for a test that runs them. Where it cannot be built the test skips and says
    why; under CI (CI=true), whose scripts/test.sh installs g++, it fails: there a failed build is a fault."""
    try:
        return kernels.load()
    except kernels.KernelsUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail("the fused kernels must build under CI: %s" % e)
        pytest.skip("the fused kernels are unavailable here: %s" % e)


def train_tiny_model(root, *prepro_flags):
    """(logdir, data_dir) under root of conftest.py's tiny_model: a 1-block model trained 60 steps on
    2000 generated pairs (prepro.py with prepro_flags on top, e.g. --reverse)."""
    import prepro
    import train
    data_dir, logdir = str(root / "data"), str(root / "run")
    assert prepro.main(["--dataset", "numbers", "--n_train", "2000", "--n_eval", "50", "--n_test",
                        "50", "--vocab_size", "300", "--data_dir", data_dir, *prepro_flags]) == 0
    assert train.main(["--data_dir", data_dir, "--logdir", logdir, "--max_steps", "60",
                       "--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2",
                       "--batch_size", "2000", "--lr", "0.01", "--warmup_steps", "20",
                       "--dropout_rate", "0", "--test_batch_size", "256",
                       "--maxlen1", str(TINY_MODEL_MAXLEN1), "--maxlen2", "30", "--eval_every", "100",
                       "--precision", "fp32"]) == 0
    return logdir, data_dir
