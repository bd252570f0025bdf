"""avg_checkpoints.py: the mean of known checkpoints, registered as the latest, restorable; clear errors."""
import os

import numpy as np
import pytest
import tensorflow as tf

import avg_checkpoints
from model import SCHEDULE_TOTAL_STEPS
from model_fixtures import build, small_hp, train_step
from toolkit.base.errors import UserError
from hparams import Hparams
from in_process import run_in_process
from toolkit.training.logdir import find_checkpoint, restore, save_hparams

tf1 = tf.compat.v1


@pytest.fixture(scope="module")
def model():
    """The variables train.py saves (weights, Adam's, global_step, training_state) of a small model, in a graph of
    their own: (graph, {checkpoint name: variable}, names of the weights)."""
    graph = tf.Graph()
    with graph.as_default():
        hp = small_hp(num_blocks=1)
        _, ph = build(hp)
        train_step(hp, ph)
        tf1.get_variable("training_state", initializer=tf.constant([0, 0], tf.int64), trainable=False)
        variables = {v.op.name: v for v in tf1.global_variables()}
        return graph, variables, [v.op.name for v in tf1.trainable_variables()]


def save_known_checkpoints(logdir, model, seeds_and_steps):
    """Saves hparams.json and one checkpoint per (seed, step) in logdir as train.py does, every float variable
    filled with values drawn from seed, global_step = step, training_state = [step, step + 1] and
    lr_schedule_total_steps = 100 * step. Returns the {name: value} of each."""
    graph, variables, _ = model
    saved = []
    os.makedirs(logdir, exist_ok=True)
    save_hparams(Hparams().parser.parse_args(["--logdir", logdir], namespace=small_hp(num_blocks=1)), logdir)
    with graph.as_default(), tf1.Session() as sess:
        saver = tf1.train.Saver(max_to_keep=5, save_relative_paths=True)
        state = tf1.train.get_checkpoint_state(logdir)
        if state:
            saver.recover_last_checkpoints(state.all_model_checkpoint_paths)
        for seed, step in seeds_and_steps:
            rng = np.random.RandomState(seed)
            values = {name: rng.uniform(-1, 1, v.shape.as_list()).astype(np.float32)
                      for name, v in variables.items() if v.dtype.base_dtype == tf.float32}
            values.update(global_step=np.int64(step), training_state=np.array([step, step + 1], np.int64),
                          **{SCHEDULE_TOTAL_STEPS: np.int64(100 * step)})
            # every variable's initializer with its value fed, in one run (Variable.load is a run per variable)
            initializers = [variables[name].initializer for name in values]
            sess.run(initializers, {op.inputs[1]: values[name] for name, op in zip(values, initializers)})
            saver.save(sess, os.path.join(logdir, "E%02d" % step), global_step=step, write_meta_graph=False)
            saved.append(values)
    return saved


def checkpoint_values(ckpt):
    reader = tf.train.load_checkpoint(ckpt)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture
def logdir(tmp_path):
    return str(tmp_path / "run")


@pytest.mark.slow
def test_average_of_two_checkpoints_is_their_mean(logdir, model):
    _, second, third = save_known_checkpoints(logdir, model, [(1, 10), (2, 20), (3, 30)])
    assert avg_checkpoints.main(["--logdir", logdir, "--last", "2"]) == 0

    ckpt = find_checkpoint(logdir)  # what test.py --logdir picks
    assert os.path.basename(ckpt) == "avg_last2-30"
    averaged = checkpoint_values(ckpt)
    assert set(averaged) == set(third)
    graph, variables, weights = model
    assert {"shared_weight_matrix/weight_mat", "encoder/num_blocks_0/multihead_attention/ln/gamma"} <= set(weights)
    for name in weights:
        np.testing.assert_allclose(averaged[name], (second[name] + third[name]) / 2, rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    slots = [name for name in third if name not in weights]
    assert {"global_step", "training_state", "beta1_power", "beta2_power",
            "shared_weight_matrix/weight_mat/Adam", "shared_weight_matrix/weight_mat/Adam_1"} <= set(slots)
    for name in slots:
        np.testing.assert_array_equal(averaged[name], third[name], err_msg=name)

    listed = [os.path.basename(p) for p in tf1.train.get_checkpoint_state(logdir).all_model_checkpoint_paths]
    assert listed == ["E10-10", "E20-20", "E30-30", "avg_last2-30"]
    with open(os.path.join(logdir, "checkpoint")) as f:
        assert os.path.abspath(logdir) not in f.read()  # relative paths, like train.py's

    with graph.as_default(), tf1.Session() as sess:  # restores into the model as test.py does
        restore(sess, ckpt, logdir)
        for name, value in sess.run(variables).items():
            np.testing.assert_array_equal(value, averaged[name], err_msg=name)


@pytest.mark.slow
def test_averaged_checkpoints_are_never_averaged_again(logdir, model):
    _, second, third = save_known_checkpoints(logdir, model, [(1, 10), (2, 20), (3, 30)])
    avg_checkpoints.main(["--logdir", logdir, "--last", "3"])
    assert avg_checkpoints.main(["--logdir", logdir, "--last", "2", "--output", "avg_recent"]) == 0
    averaged = checkpoint_values(os.path.join(logdir, "avg_recent-30"))
    name = "encoder/num_blocks_0/positionwise_feedforward/inner/kernel"
    np.testing.assert_allclose(averaged[name], (second[name] + third[name]) / 2, rtol=1e-6, atol=1e-7)
    assert os.path.basename(find_checkpoint(logdir)) == "avg_recent-30"


@pytest.mark.slow
def test_fewer_checkpoints_than_asked(logdir, model):
    save_known_checkpoints(logdir, model, [(1, 10), (2, 20)])
    with pytest.raises(UserError, match=r"lists 2 checkpoints written by train.py \(E10-10, E20-20\), "
                                        r"fewer than --last 3"):
        avg_checkpoints.main(["--logdir", logdir, "--last", "3"])


@pytest.mark.slow
def test_checkpoints_of_different_models(logdir, model):
    save_known_checkpoints(logdir, model, [(1, 10)])
    values = checkpoint_values(os.path.join(logdir, "E10-10"))
    del values["decoder/num_blocks_0/vanilla_attention/ln/beta"]
    values["encoder/num_blocks_0/multihead_attention/q/bias"] = np.zeros([7], np.float32)
    avg_checkpoints.make_latest(logdir, avg_checkpoints.write_checkpoint(values, os.path.join(logdir, "E20"), 20))
    with pytest.raises(UserError, match="E10-10 and .*E20-20 hold different variables \\(2 differ, e.g. "
                                        "decoder/num_blocks_0/vanilla_attention/ln/beta, "
                                        "encoder/num_blocks_0/multihead_attention/q/bias\\): average checkpoints "
                                        "of one model"):
        avg_checkpoints.main(["--logdir", logdir, "--last", "2"])


def test_output_must_be_marked_as_averaged(logdir):
    with pytest.raises(UserError, match="--output best must be a file name starting with avg_"):
        avg_checkpoints.main(["--logdir", logdir, "--last", "2", "--output", "best"])


def test_missing_logdir_is_one_line_and_exit_code_2(tmp_path, capsys):
    code, _, err = run_in_process(capsys, "avg_checkpoints.py", avg_checkpoints.main, "--logdir", tmp_path / "nowhere",
                                  "--last", "5")
    assert code == 2
    assert err.strip().splitlines()[-1] == "error: --logdir %s not found: pass a logdir written by train.py" % (
        tmp_path / "nowhere")
    assert "Traceback" not in err


def test_a_directory_that_train_py_did_not_write_is_refused(tmp_path):
    with pytest.raises(UserError, match="hparams.json not found: is %s a logdir written by train.py" % tmp_path):
        avg_checkpoints.main(["--logdir", str(tmp_path), "--last", "1"])


def test_a_bad_flag_is_one_line_and_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        avg_checkpoints.main(["--last", "two"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: argument --last: invalid int value: 'two'"]
