"""Averages the weights of the last N checkpoints of a logdir into a new checkpoint
in the same logdir.

    python avg_checkpoints.py --logdir runs/multi30k --last 5 [--output avg_last5]

Writes LOGDIR/OUTPUT-STEP (OUTPUT defaults to avg_lastN, STEP is the newest checkpoint's global
step) and makes it the latest checkpoint of the logdir, so that `test.py --logdir LOGDIR` and
translate.py use it by default; `--ckpt LOGDIR/OUTPUT-STEP` names it explicitly.

What the averaged checkpoint holds:
    model weights (every float variable but Adam's)       the mean over the N checkpoints
    Adam's moments (NAME/Adam, NAME/Adam_1), beta1_power,  copied from the newest checkpoint
    beta2_power, global_step, training_state
It is the newest checkpoint with its weights replaced by their mean: step, optimizer state and
position in the data stay consistent with one another, so it restores wherever a checkpoint of
train.py does.

The last N are counted among train.py's checkpoints only: averaged checkpoints (names starting with
avg_) are never averaged again. They are for testing and translating, not for resuming training.
"""
import os

from toolkit.base import runtime  # first: TensorFlow's environment defaults

import numpy as np
import tensorflow as tf

from toolkit.base.errors import DiskFull, UserError, writing
from toolkit.base.cli import OneLineParser, run_cli
from toolkit.training.logdir import (AVERAGED_PREFIX, checkpoint_state, is_averaged,
                                     load_trained_hparams, logdir_lock, open_checkpoint, reading,
                                     remove_partial_checkpoints)
from toolkit.base.writing import check_path_name, check_writable_dir

tf1 = tf.compat.v1

#: What to do about a checkpoint that can not be read.
REMEDY = "average other checkpoints (a smaller --last) or delete it"

#: What ends the names of Adam's two moment slots, and the names of its bias-correction powers.
ADAM_SLOT_SUFFIXES = ("/Adam", "/Adam_1")
ADAM_POWERS = ("beta1_power", "beta2_power")


def is_weight(name, dtype):
    """Whether the checkpoint variable name (of tf.DType dtype) is a model weight, i.e. float and
    not Adam's."""
    return dtype.is_floating and not name.endswith(ADAM_SLOT_SUFFIXES) and name not in ADAM_POWERS


def parse_args(argv):
    """The command-line flags; a bad --last or --output is a UserError."""
    parser = OneLineParser(prog="avg_checkpoints.py", description="Average the weights of the last "
                                                                  "N checkpoints of a logdir into "
                                                                  "a new checkpoint there, which "
                                                                  "becomes the latest.")
    parser.add_argument("--logdir", required=True, help="a logdir written by train.py")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest "
                                                                "checkpoints to average")
    parser.add_argument("--output", help="name of the new checkpoint, saved as LOGDIR/OUTPUT-STEP; "
                                         "must start with %s (default %slastN)"
                        % (AVERAGED_PREFIX, AVERAGED_PREFIX))
    args = parser.parse_args(argv)
    if args.last < 1:
        raise UserError("--last must be at least 1, not %d" % args.last)
    if args.output == "":
        raise UserError("--output is empty: pass a name, or leave the flag out")
    args.output = args.output or "%slast%d" % (AVERAGED_PREFIX, args.last)
    check_path_name(args.output, "output", "a checkpoint name")  # LOGDIR/OUTPUT-STEP.*
    if not args.output.startswith(AVERAGED_PREFIX):
        raise UserError("--output %s must be a file name starting with %s, so that later averages "
                        "and training runs can tell it from train.py's checkpoints"
                        % (args.output, AVERAGED_PREFIX))
    return args


def select_checkpoints(logdir, last):
    """The last `last` checkpoints train.py wrote in logdir, oldest first, as listed in its
    checkpoint state."""
    if not os.path.isdir(logdir):
        raise UserError("--logdir %s %s: pass a logdir written by train.py"
                        % (logdir, "is a file" if os.path.exists(logdir) else "not found"))
    load_trained_hparams(logdir, {})  # refuses a directory that train.py did not write
    # before the averaging, which a read-only logdir would waste
    check_writable_dir(logdir, "logdir")
    state = checkpoint_state(logdir)
    trained = [p for p in state.all_model_checkpoint_paths if not is_averaged(p)] if state else []
    if len(trained) < last:
        raise UserError("%s lists %d checkpoints written by train.py (%s), fewer than --last %d"
                        % (logdir, len(trained), ", ".join(map(os.path.basename, trained))
                           or "none", last))
    return trained[-last:]


def check_same_variables(expected, found, expected_ckpt, found_ckpt):
    """expected, found: {name: (shape, dtype)} of two checkpoints. Different names or shapes
    are a UserError."""
    differences = sorted(set(expected) ^ set(found)) + sorted(
        name for name in set(expected) & set(found) if expected[name] != found[name])
    if differences:
        raise UserError("%s and %s hold different variables (%d differ, e.g. %s): average "
                        "checkpoints of one model"
                        % (found_ckpt, expected_ckpt, len(differences), ", ".join(differences[:3])))


def average(checkpoints):
    """checkpoints: paths, oldest first. Returns {name: numpy value}: model weights averaged over
    all of them (summed in float64), every other variable taken from the newest."""
    newest, variables = open_checkpoint(checkpoints[-1], REMEDY)
    sums = {name: np.zeros(shape, np.float64) for name, (shape, dtype) in variables.items()
            if is_weight(name, dtype)}
    for ckpt in checkpoints:
        reader, found = open_checkpoint(ckpt, REMEDY)
        check_same_variables(variables, found, checkpoints[-1], ckpt)
        with reading(ckpt, REMEDY):
            for name, total in sums.items():
                total += reader.get_tensor(name)
    with reading(checkpoints[-1], REMEDY):
        values = {name: newest.get_tensor(name) for name in variables if name not in sums}
    values.update({name: (total / len(checkpoints)).astype(variables[name][1].as_numpy_dtype)
                   for name, total in sums.items()})
    return values


def write_checkpoint(values, prefix, step):
    """Saves values {name: numpy value} as the checkpoint prefix-step (no .meta, no checkpoint
    state). Returns its path."""
    with tf.Graph().as_default():
        variables, feeds = {}, {}
        for name, value in values.items():
            initial_value = tf1.placeholder(tf.as_dtype(value.dtype), value.shape)
            variables[name] = tf1.Variable(initial_value, trainable=False)
            feeds[initial_value] = value
        saver = tf1.train.Saver(variables)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer(), feeds)
            return saver.save(sess, prefix, global_step=step, write_meta_graph=False,
                              write_state=False)


def make_latest(logdir, ckpt):
    """Appends ckpt to logdir's checkpoint state as its latest checkpoint, keeping the others
    listed. Paths are written relative to logdir, as train.py writes them."""
    state = checkpoint_state(logdir)
    listed = [os.path.relpath(p, logdir) for p in state.all_model_checkpoint_paths] if state else []
    name = os.path.relpath(ckpt, logdir)
    tf1.train.update_checkpoint_state(os.path.abspath(logdir), name,
                                      [p for p in listed if p != name] + [name])


def main(argv=None):
    runtime.start_graph_mode()
    args = parse_args(argv)
    checkpoints = select_checkpoints(args.logdir, args.last)
    values = average(checkpoints)
    if "global_step" not in values:
        raise UserError("%s has no global_step: is it a checkpoint of train.py?" % checkpoints[-1])
    # train.py's Saver writes the same checkpoint index
    with logdir_lock(args.logdir, "avg_checkpoints.py"):
        remove_partial_checkpoints(args.logdir)  # what a killed save left (*.tempstate*)
        prefix = "%s-%d" % (os.path.join(args.logdir, args.output), values["global_step"])
        try:
            with writing(prefix, "the checkpoint %s" % os.path.basename(prefix)):
                ckpt = write_checkpoint(values, os.path.join(args.logdir, args.output),
                                        int(values["global_step"]))
                make_latest(args.logdir, ckpt)
        except DiskFull:
            remove_partial_checkpoints(args.logdir, prefix)
            raise
    print("averaged %s into %s, now the latest checkpoint of %s"
          % (", ".join(map(os.path.basename, checkpoints)), os.path.basename(ckpt), args.logdir))
    return 0


if __name__ == "__main__":
    run_cli(main)
