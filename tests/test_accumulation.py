"""Gradient accumulation (--accum_steps, toolkit/training/step.py): N batches give the update of one batch
holding the same sentences, with the loss normalised by all their target tokens together; and a run without it
builds the step it always did."""
import numpy as np
import pytest
import tensorflow as tf

from model_fixtures import Placeholders, random_ids, small_hp, train_step

tf1 = tf.compat.v1

STEPS = 3
#: smoothing on, so that the normalisation of the label-smoothed loss is held to it too; dropout off (the
#: fixture's), so that a batch's loss is a function of its sentences alone
HP = dict(smoothing=0.1, lr=1e-3, warmup_steps=4)


def batches(rng, hp):
    """STEPS batches of 4 pairs of various lengths: (x, y) each."""
    return [(random_ids(rng, rng.randint(2, 9, 4), hp.vocab_size), random_ids(rng, rng.randint(2, 9, 4), hp.vocab_size))
            for _ in range(STEPS)]


def trimmed(ids):
    """ids without the columns that are padding in every row (as data_load batches them)."""
    return ids[:, :max(int((ids != 0).sum(1).max()), 1)]


def train(hp, data, initial=None):
    """Trains a fresh model on data, each batch's rows cut into hp.accum_steps batches. Returns the losses per
    optimizer step (target-token-weighted), every global variable by name, and the initial values it used."""
    with tf.Graph().as_default():
        tf1.set_random_seed(0)
        ph = Placeholders()
        step = train_step(hp, ph)
        variables = tf1.global_variables()
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            if initial is None:
                initial = {v.name: value for v, value in zip(variables, sess.run(variables))}
            for v in variables:
                v.load(initial[v.name], sess)
            losses = []
            for x, y in data:
                parts = np.array_split(np.arange(len(x)), hp.accum_steps)
                loss, tokens = 0.0, 0.0
                for rows in parts:
                    out = sess.run(step.batch, ph.feed(trimmed(x[rows]), trimmed(y[rows])))
                    loss, tokens = loss + out["loss"], tokens + out["tokens"]
                if step.apply is None:
                    losses.append(loss)
                else:
                    sess.run(step.apply)
                    losses.append(loss / tokens)
            values = {v.name: value for v, value in zip(variables, sess.run(variables))}
    return np.array(losses), values, initial


@pytest.mark.slow
@pytest.mark.parametrize("impl, accum_steps", [("reference", 2), ("fast", 4)])
def test_accumulated_batches_make_the_update_of_one_batch(impl, accum_steps):
    data = batches(np.random.RandomState(5), small_hp())
    whole_losses, whole, initial = train(small_hp(impl=impl, **HP), data)
    accumulated_losses, accumulated, _ = train(small_hp(impl=impl, accum_steps=accum_steps, **HP), data, initial)
    np.testing.assert_allclose(accumulated_losses, whole_losses, rtol=1e-5)
    assert set(accumulated) == set(whole)  # the accumulators are local variables: never saved
    assert accumulated["global_step:0"] == whole["global_step:0"] == STEPS
    for name, value in whole.items():
        if "/k/bias" in name:  # its gradient is 0 but for rounding (softmax ignores what every key adds), and
            continue           # Adam scales rounding noise up to full steps
        np.testing.assert_allclose(accumulated[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    moved = max(np.abs(whole[name] - initial[name]).max() for name in whole if "kernel" in name)
    assert moved > 1e-3  # the steps did change the weights


def test_without_accumulation_a_batch_applies_its_own_update():
    with tf.Graph().as_default():
        step = train_step(small_hp(), Placeholders())
        assert step.apply is None and not tf1.local_variables()
