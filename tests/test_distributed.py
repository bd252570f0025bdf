"""Data-parallel training (distributed.py): two worker processes on 127.0.0.1 against a single-process run.

Run as a script (python tests/test_distributed.py CKPT OUT.npz, with TF_CONFIG set) this file is one worker of
test_two_workers_train_like_one_process: see run_worker.
"""
import json
import os
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from toolkit.training import distributed, step
from data_load import Sources, Targets
from model_fixtures import Placeholders, random_ids, small_hp
from toolkit.base.errors import UserError

tf1 = tf.compat.v1

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20
WORKER_TIMEOUT_S = 120
#: dropout off, so that a replicated step computes exactly what one process computes on the same global batch.
HP = dict(dropout_rate=0.0, smoothing=0.1, num_blocks=1)


def global_batches():
    """STEPS global batches (x (N, T1), y (N, T2)) of 5 sentences of various lengths, the same in every process."""
    rng = np.random.RandomState(7)
    vocab_size = small_hp().vocab_size
    return [(random_ids(rng, rng.randint(2, 9, 5), vocab_size), random_ids(rng, rng.randint(2, 9, 5), vocab_size))
            for _ in range(STEPS)]


def summary_values(serialized):
    """A Summary proto's values by tag: a scalar's value, an image's (height, width)."""
    summary = tf1.Summary.FromString(serialized)
    return {value.tag: value.simple_value if value.WhichOneof("value") == "simple_value"
            else np.array([value.image.height, value.image.width]) for value in summary.value}


def train_graph(cluster, hp, ph):
    """train.py's step and the cluster's votes over the placeholders ph."""
    return SimpleNamespace(step=step.build_step(hp, ph.xs, ph.ys, cluster), votes=distributed.build_votes(cluster))


def train_steps(sess, g, ph):
    """Runs one training step per global batch. Returns the losses (STEPS,), every variable by name, and the
    training summaries of the first batch before its step (by tag, see summary_values), which are empty where
    write_summaries is fed False."""
    batches = global_batches()
    assert sess.run(g.step.batch["summaries"], {**ph.feed(*batches[0]), g.step.write_summaries: False}) == b""
    summaries = summary_values(sess.run(g.step.batch["summaries"], ph.feed(*batches[0])))
    losses = [sess.run([g.step.batch["loss"], g.step.batch["update"]], ph.feed(x, y))[0] for x, y in batches]
    variables = tf1.global_variables()
    return np.array(losses), dict(zip([v.name for v in variables], sess.run(variables))), summaries


def run_worker(ckpt, out):
    """One multiworker process (TF_CONFIG in the environment). Votes on a checkpoint that differs between the
    workers, initializes its variables with a seed of its own (the chief's initial values must reach every worker),
    restores ckpt, votes to stop on worker 1 only, trains STEPS steps and writes what it saw to out (.npz)."""
    tf1.disable_eager_execution()
    task_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    tf1.set_random_seed(100 + task_index)
    cluster = distributed.make_cluster(SimpleNamespace(distribute="multiworker"), tf1.ConfigProto())
    ph = Placeholders()
    g = train_graph(cluster, small_hp(**HP), ph)
    init, saver = tf1.global_variables_initializer(), tf1.train.Saver()
    with tf1.Session(cluster.target, config=cluster.config) as sess:
        try:
            distributed.agree_on_checkpoint(sess, g.votes, "logdir/E01-100" if task_index else "logdir/E02-200")
            disagreement_found = False
        except UserError:
            disagreement_found = True
        distributed.agree_on_checkpoint(sess, g.votes, None)
        sess.run(init)
        initial = sess.run(tf1.trainable_variables()[0])
        distributed.agree_on_checkpoint(sess, g.votes, ckpt)
        saver.restore(sess, ckpt)
        stop_votes = distributed.agree_to_stop(sess, g.votes, "SIGTERM" if task_index else None, False)
        losses, variables, summaries = train_steps(sess, g, ph)
    np.savez(out, losses=losses, initial=initial, is_chief=cluster.is_chief, process_index=cluster.process_index,
             disagreement_found=disagreement_found, stop_votes=stop_votes,
             **{"var/" + name: value for name, value in variables.items()},
             **{"summary/" + tag: value for tag, value in summaries.items()})


def free_ports(count):
    """count distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_config(ports, index):
    """TF_CONFIG of worker index in a cluster of workers on 127.0.0.1:ports."""
    return json.dumps({"cluster": {"worker": ["127.0.0.1:%d" % p for p in ports]},
                       "task": {"type": "worker", "index": index}})


@pytest.fixture
def start_workers():
    """start_workers(ckpt, outs) starts one worker per output path (its log: the path + ".log"); every worker is
    killed at teardown."""
    processes = []

    def start(ckpt, outs):
        ports = free_ports(len(outs))
        for index, out in enumerate(outs):
            env = dict(os.environ, TF_CONFIG=tf_config(ports, index), TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
            with open(out + ".log", "wb") as log:
                processes.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), ckpt, out], cwd=REPO,
                                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        return processes

    yield start
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-process run that the replicated ones are compared with, shared by the tests of this module:
    its initial checkpoint (.ckpt, written here) and .train(), which trains it from there once and returns (losses,
    variables, summaries) of train_steps, the same to every later caller."""
    ckpt = str(tmp_path_factory.mktemp("reference") / "init")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        cluster = distributed.make_cluster(SimpleNamespace(distribute="none"), tf1.ConfigProto())
        ph = Placeholders()
        g = train_graph(cluster, small_hp(**HP), ph)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
        tf1.train.Saver().save(sess, ckpt)
    trained = []

    def train():
        if not trained:
            with graph.as_default(), sess:
                trained.append(train_steps(sess, g, ph))
        return trained[0]
    yield SimpleNamespace(ckpt=ckpt, train=train)
    sess.close()


@pytest.mark.slow
def test_two_workers_train_like_one_process(tmp_path, start_workers, reference):
    outs = [str(tmp_path / "worker0.npz"), str(tmp_path / "worker1.npz")]
    workers = start_workers(reference.ckpt, outs)
    expected = reference.train()  # while the workers start
    for worker, out in zip(workers, outs):
        worker.wait(timeout=WORKER_TIMEOUT_S)
        with open(out + ".log", errors="replace") as log:
            assert worker.returncode == 0, log.read()[-3000:]
    chief, other = (dict(np.load(out)) for out in outs)
    assert chief["is_chief"] and not other["is_chief"]
    assert (chief["process_index"], other["process_index"]) == (0, 1)
    assert chief["disagreement_found"] and other["disagreement_found"]
    assert list(chief["stop_votes"]) == list(other["stop_votes"]) == [True, False]  # worker 1's SIGTERM
    np.testing.assert_array_equal(chief["initial"], other["initial"])  # broadcast from the chief, not their seeds
    np.testing.assert_array_equal(chief["losses"], other["losses"])
    variables = {name[4:]: value for name, value in chief.items() if name.startswith("var/")}
    for name, value in variables.items():
        np.testing.assert_array_equal(value, other["var/" + name], err_msg=name)
    summaries = {name[8:]: value for name, value in chief.items() if name.startswith("summary/")}
    assert_trained_like_one_process(chief["losses"], variables, summaries, *expected)


def assert_trained_like_one_process(losses, variables, summaries, reference_losses, reference_variables,
                                    reference_summaries):
    """Same summaries of the first batch (loss, lr, the norm of the gradient summed over replicas, an attention
    image), same first loss (1e-4), losses and variables (1e-3) after STEPS steps, global step, and it learned."""
    assert sorted(summaries) == sorted(reference_summaries) == ["attention/image/0", "grad_norm", "loss", "lr"]
    assert reference_summaries["grad_norm"] > 0.1
    for tag in "loss", "lr", "grad_norm":
        np.testing.assert_allclose(summaries[tag], reference_summaries[tag], rtol=1e-5, err_msg=tag)
    # the first sentence's attention: T2 x T1 of the global batch, or of the first replica's rows, trimmed
    assert np.all(0 < summaries["attention/image/0"]) and np.all(
        summaries["attention/image/0"] <= reference_summaries["attention/image/0"])
    assert abs(losses[0] - reference_losses[0]) < 1e-4, (losses[0], reference_losses[0])
    np.testing.assert_allclose(losses, reference_losses, atol=1e-3)
    assert losses[-1] < losses[0] - 0.1
    assert sorted(variables) == sorted(reference_variables)
    assert variables["global_step:0"] == STEPS
    for name, value in variables.items():
        if "/k/bias" not in name:  # its true gradient is 0 (softmax ignores it): Adam amplifies rounding noise
            np.testing.assert_allclose(value, reference_variables[name], atol=1e-3, err_msg=name)


@pytest.mark.slow
def test_mirrored_on_two_cpus_matches_one_process(reference):
    with tf.Graph().as_default():
        cluster = distributed.make_cluster(SimpleNamespace(distribute="mirrored", devices="/cpu:0,/cpu:1"),
                                           tf1.ConfigProto())
        ph = Placeholders()
        g = train_graph(cluster, small_hp(**HP), ph)
        assert cluster.strategy.num_replicas_in_sync == 2
        with tf1.Session(cluster.target, config=cluster.config) as sess:
            tf1.train.Saver().restore(sess, reference.ckpt)
            trained = train_steps(sess, g, ph)
    assert_trained_like_one_process(*trained, *reference.train())


@pytest.mark.slow
def test_mirrored_accumulation_on_two_cpus_matches_one_process(reference):
    """--accum_steps 2 on two replicas: each global batch fed as two halves, then applied, trains what one process
    trains on the whole global batches (same losses and variables)."""
    with tf.Graph().as_default():
        cluster = distributed.make_cluster(SimpleNamespace(distribute="mirrored", devices="/cpu:0,/cpu:1"),
                                           tf1.ConfigProto())
        ph = Placeholders()
        g = train_graph(cluster, small_hp(accum_steps=2, **HP), ph)
        assert g.step.apply is not None and cluster.strategy.num_replicas_in_sync == 2
        with tf1.Session(cluster.target, config=cluster.config) as sess:
            tf1.train.Saver().restore(sess, reference.ckpt)
            sess.run(tf1.local_variables_initializer())
            losses = []
            for x, y in global_batches():
                loss, tokens = 0.0, 0.0
                for half in (slice(0, 3), slice(3, None)):
                    out = sess.run(g.step.batch, ph.feed(x[half], y[half]))
                    loss, tokens = loss + out["loss"], tokens + out["tokens"]
                sess.run(g.step.apply)
                losses.append(loss / tokens)
            variables = {v.name: value for v, value in zip(tf1.global_variables(), sess.run(tf1.global_variables()))}
    reference_losses, reference_variables, _ = reference.train()
    np.testing.assert_allclose(losses, reference_losses, atol=1e-3)
    assert variables["global_step:0"] == STEPS and sorted(variables) == sorted(reference_variables)
    for name, value in variables.items():
        if "/k/bias" not in name:  # see assert_trained_like_one_process
            np.testing.assert_allclose(value, reference_variables[name], atol=1e-3, err_msg=name)


def test_one_process_agrees_with_itself_without_running_anything():
    with tf.Graph().as_default():
        ph = Placeholders()
        g = train_graph(distributed.make_cluster(SimpleNamespace(distribute="none"), tf1.ConfigProto()),
                        small_hp(**HP), ph)
    assert distributed.agree_to_stop(None, g.votes, "SIGINT", False) == (True, False)
    assert distributed.agree_to_stop(None, g.votes, None, True) == (False, True)
    distributed.agree_on_checkpoint(None, g.votes, "logdir/E01-100")


@pytest.mark.parametrize("num_rows, expected", [
    (5, [(0, 2), (2, 5)]),
    (4, [(0, 2), (2, 4)]),
    (1, [(0, 0), (0, 1)]),
])
def test_replica_rows_deal_contiguous_blocks(num_rows, expected):
    assert [step.replica_rows(num_rows, r, 2) for r in range(2)] == expected


def test_a_replica_without_rows_gets_an_empty_batch():
    x = np.array([[5, 6, 3, 0], [7, 3, 0, 0]], np.int32)
    with tf.Graph().as_default():
        xs = Sources(tf.constant(x), tf.constant([3, 2]))
        ys = Targets(tf.constant(x), tf.constant(x), tf.constant([3, 2]))
        shares = [step.replica_batch(xs, ys, r, 3) for r in range(3)]
        with tf1.Session() as sess:
            (first, _), (second, _), (third, third_ys) = sess.run(shares)
    assert first.x.shape == (0, 1)
    np.testing.assert_array_equal(second.x, x[:1, :3])  # trimmed to its own longest sentence
    np.testing.assert_array_equal(third.x, x[1:, :2])
    np.testing.assert_array_equal(third_ys.y, x[1:, :2])


@pytest.mark.parametrize("tf_config, message", [
    (None, "needs the TF_CONFIG environment variable"),
    ("{not json", "TF_CONFIG is not"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}}', "TF_CONFIG is not"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}', "are \"chief\" or \"worker\""),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 1}}', "is not in its cluster"),
])
def test_bad_tf_config_is_a_user_error(monkeypatch, tf_config, message):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(UserError, match=message):
        distributed.make_cluster(SimpleNamespace(distribute="multiworker"), tf1.ConfigProto())


def test_mirrored_needs_two_devices():
    with pytest.raises(UserError, match="at least two devices"):
        distributed.parse_devices("/cpu:0")


def test_checkpoint_fingerprint_names_the_file_not_its_directory():
    fingerprint = distributed.checkpoint_fingerprint
    assert fingerprint("/a/E01_L2.34-1500") == fingerprint("b/E01_L2.34-1500")
    assert fingerprint("a/E01_L2.34-1500") != fingerprint("a/E02_L2.30-3000")
    assert fingerprint(None) == -1

if __name__ == "__main__":
    run_worker(*sys.argv[1:])
