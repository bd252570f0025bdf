"""A training run's checkpoints: the newest restored or the variables initialized (from
--init_from's weights when fine-tuning), each save made so that a full disk leaves nothing
half-written, and the last good checkpoint named when training stops on an error."""
import os

import tensorflow as tf

from toolkit.training import distributed
from toolkit.base.errors import DiskFull, UserError, is_disk_full
from toolkit.training.logdir import (check_weights_fit, checkpoint_state, find_checkpoint,
                                     is_averaged, remove_partial_checkpoints, restore,
                                     restore_weights)
from toolkit.training.flags import init_source

tf1 = tf.compat.v1


def restore_or_init(sess, g, logdir, init_ckpt=None):
    """Restores the newest checkpoint that train.py wrote in logdir (returns its path) or, if logdir
    has none, initializes the variables (returns None). Averaged checkpoints (avg_*, see
    avg_checkpoints.py) are passed over: training goes on from where it stopped, and the Saver never
    rotates them away. A newest checkpoint that is missing or unreadable is a UserError, never a
    fresh start. Every worker must agree on the checkpoint. Initialized, the weights come from
    init_ckpt (--init_from's checkpoint, init_checkpoint) if given."""
    state = checkpoint_state(logdir)
    trained = [p for p in state.all_model_checkpoint_paths if not is_averaged(p)] if state else []
    ckpt = find_checkpoint(logdir, trained[-1]) if trained else None
    distributed.agree_on_checkpoint(sess, g.votes, ckpt)
    sess.run(g.local_init)
    if ckpt is None:
        sess.run(g.init)
        if init_ckpt:
            restore_weights(sess, init_ckpt, "--init_from's checkpoint %s" % init_ckpt)
            print("weights from %s; optimizer and learning-rate schedule start afresh at step 0"
                  % init_ckpt)
        return None
    restore(sess, ckpt, logdir, g.saver)
    g.saver.recover_last_checkpoints(trained)
    return ckpt


def init_checkpoint(hp):
    """The checkpoint a new run's --init_from names (None without one, or when the logdir holds a
    run, which resumes from its own), refused before anything is written if its weights do not fit
    the model just built (a source run's hparams.json edited, or its checkpoint replaced)."""
    if not hp.init_from or checkpoint_state(hp.logdir):
        return None
    _, source = init_source(hp.init_from)
    check_weights_fit(source, "--init_from %s (%s)" % (hp.init_from, source))
    return source


def save(sess, g, hp, epoch, epoch_step, name):
    """Saves weights, optimizer state and [epoch, epoch_step] as logdir/name-STEP. Returns the path.
    A full disk is a DiskFull, with every file of the half-written checkpoint removed."""
    sess.run(g.save_state, {g.new_state: [epoch, epoch_step]})
    try:
        return g.saver.save(sess, os.path.join(hp.logdir, name), global_step=g.step.global_step,
                               write_meta_graph=False)
    except (tf.errors.OpError, OSError) as error:
        if not (is_disk_full(error) or isinstance(error, tf.errors.ResourceExhaustedError)):
            raise
        prefix = "%s-%d" % (os.path.join(hp.logdir, name), sess.run(g.step.global_step))
        remove_partial_checkpoints(hp.logdir, prefix)
        raise DiskFull("the checkpoint %s" % os.path.basename(prefix), prefix) from None


def last_good_checkpoint(g):
    """The newest checkpoint that the Saver wrote or restored in this run and whose files exist,
    or None."""
    existing = [path for path in g.saver.last_checkpoints if tf1.train.checkpoint_exists(path)]
    return existing[-1] if existing else None


def disk_full(error, g, hp, events):
    """The UserError for a full disk (error, a DiskFull) once what was half-written is gone: a torn
    summary record and the files of a checkpoint being written; the last good checkpoint stays."""
    events.cut_off()
    remove_partial_checkpoints(hp.logdir)
    return UserError("%s; removed what was half-written, the last good checkpoint %s is untouched: "
                     "free some space and run the same command to resume"
                     % (error, last_good_checkpoint(g) or "(none yet)"))
