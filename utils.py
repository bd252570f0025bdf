"""Helpers shared by train.py, test.py and translate.py: hyperparameter files, atomic writes, turning ids into
text, translating a whole dataset, and BLEU.

BLEU is sacreBLEU on detokenized, cased text (the scoring that published numbers can be compared with).
"""
import contextlib
import fcntl
import glob
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from argparse import Namespace

import numpy as np
import sacrebleu
import tensorflow as tf
from tqdm import tqdm

import datadir
from errors import DiskFull, UserError, is_disk_full
from hparams import LEGACY_VALUES, MODEL_FLAGS, Hparams, check_ranges, range_error, type_error
from model import SCHEDULE_TOTAL_STEPS
# read_lines: for the tools that import it from here
from textio import EOS_ID, PAD_ID, atomic_write, read_json, read_lines  # noqa: F401

tf1 = tf.compat.v1


#: The lock file of a logdir, held by the train.py that trains it (or avg_checkpoints.py while it writes the
#: checkpoint index); it names that process.
LOCK_NAME = "train.lock"


@contextlib.contextmanager
def logdir_lock(logdir, tool="train.py"):
    """Holds an exclusive lock (fcntl.flock) on LOGDIR/train.lock while `tool` writes the logdir, so that two
    processes never write one logdir: a second one is refused with a UserError naming the process that holds the
    lock. The kernel releases the lock when the process ends however it ends (SIGKILL too), so a lock file left
    behind never blocks a later run. Readers (test.py, translate.py, export.py) take no lock."""
    path = os.path.join(logdir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 1000, 0).decode("utf-8", "replace").strip() or "another process"
            raise UserError("%s is being written by %s: wait for it to end, stop it, or use another --logdir"
                            % (logdir, holder)) from None
        holder = "%s process %d on %s since %s" % (tool, os.getpid(), socket.gethostname(),
                                                         time.strftime("%Y-%m-%d %H:%M:%S"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode("utf-8") + b"\n", 0)
        yield
    except OSError as error:
        if is_disk_full(error):
            raise DiskFull(path, path) from None
        raise
    finally:
        os.close(fd)  # releases the lock


def save_hparams(hp, path):
    """Writes the namespace hp as hparams.json in the directory path."""
    atomic_write(os.path.join(path, "hparams.json"), json.dumps(vars(hp), indent=2, sort_keys=True) + "\n")


def load_trained_hparams(logdir, overrides):
    """The hyperparameters of the model trained in logdir: LOGDIR/hparams.json with `overrides` (a dict of flags
    the user gave, e.g. hparams.explicit_flags) on top, their ranges checked. Flags added to hparams.py since it was
    written get the value they stood for then (hparams.LEGACY_VALUES) or their defaults; hp.trained_data_dir is the
    data dir the model was trained on. An override of the model's shape (hparams.MODEL_FLAGS) with another value
    is a UserError: the checkpoints hold that shape."""
    fpath = os.path.join(logdir, "hparams.json")
    if not os.path.exists(fpath):
        raise UserError("%s not found: is %s a logdir written by train.py?" % (fpath, logdir))
    saved = read_json(fpath, "it was damaged; restore it from a copy, or write it again with the flags the model "
                             "was trained with (see %s/specs.txt for its shape)" % logdir)
    if not isinstance(saved, dict):
        raise UserError("%s is not valid JSON for hyperparameters (not an object): restore it from a copy" % fpath)
    problem = type_error(saved, fpath) or range_error(Namespace(**saved), saved, where=fpath)
    if problem:
        raise UserError(problem)
    saved = {**LEGACY_VALUES, **saved}
    for flag in MODEL_FLAGS:
        if flag in overrides and overrides[flag] != saved.get(flag):
            raise UserError("%s holds a model with --%s %s but this run asks for %s: use another --logdir"
                            % (logdir, flag, saved.get(flag), overrides[flag]))
    hp = Hparams().parser.parse_args([], namespace=Namespace(
        **{**saved, **overrides, "logdir": logdir}))  # the defaults of flags that neither gives
    hp.trained_data_dir = saved["data_dir"]
    check_ranges(hp, overrides)
    return hp


def trained_model_files(hp, ckpt="", splits=()):
    """The manifest of hp.data_dir and the checkpoint to restore (ckpt, or the latest in hp.logdir), after
    checking the data dir's files (those of `splits` too), that the data dir's vocabulary is the one the model was
    trained with and that the checkpoint holds trained weights."""
    manifest = datadir.load_manifest(hp.data_dir, hp.trained_data_dir, hp.logdir, splits)
    datadir.check_vocab(hp, manifest, hp.trained_data_dir)
    ckpt = find_checkpoint(hp.logdir, ckpt)
    check_trained(ckpt, hp.logdir)
    return manifest, ckpt


def check_trained(ckpt, logdir):
    """Refuses a checkpoint of global step 0, whose weights are the random initial ones (earlier versions of
    train.py saved one when interrupted before the first step)."""
    try:
        step = tf.train.load_checkpoint(ckpt).get_tensor("global_step")
    except Exception:  # noqa: BLE001 (an unreadable checkpoint is reported by restore(), with the reason)
        return
    if step == 0:
        raise UserError("%s holds untrained weights (global step 0: a run interrupted before its first step saved "
                        "it): train first, or pass another --ckpt; checkpoints in %s: %s"
                        % (ckpt, logdir, existing_checkpoints(logdir)))


#: Name prefix of the checkpoints avg_checkpoints.py writes; training resumes from its own checkpoints only.
AVERAGED_PREFIX = "avg_"


def is_averaged(ckpt):
    """Whether the checkpoint path ckpt was written by avg_checkpoints.py."""
    return os.path.basename(ckpt).startswith(AVERAGED_PREFIX)


#: What follows a checkpoint's name in the names of its files (a user may pass --ckpt with one of them).
CHECKPOINT_FILE_SUFFIX = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")


def checkpoint_state(logdir):
    """The CheckpointState of logdir's index file (LOGDIR/checkpoint), None if it has none. A damaged index is a
    UserError naming the checkpoints in logdir (TensorFlow would return None, and training would start over)."""
    index = os.path.join(logdir, "checkpoint")
    if not os.path.exists(index):
        return None
    state = tf1.train.get_checkpoint_state(logdir)
    if state is None or not state.model_checkpoint_path:
        names = sorted(name[:-len(".index")] for name in os.listdir(logdir) if name.endswith(".index"))
        raise UserError("%s, the checkpoint index, is damaged: restore it from a copy, or replace it by the line "
                        "model_checkpoint_path: \"NAME\" with NAME the newest of the checkpoints in %s (%s)"
                        % (index, logdir, ", ".join(names) or "none"))
    return state


def find_checkpoint(logdir, ckpt=""):
    """The checkpoint to restore: ckpt if given (the name of one of its files works too), else the latest in
    logdir. A missing one is a UserError that lists the checkpoints that do exist."""
    ckpt = CHECKPOINT_FILE_SUFFIX.sub("", ckpt)
    state = checkpoint_state(logdir) if not ckpt else None
    ckpt = ckpt or (state.model_checkpoint_path if state else "")
    if not ckpt or not tf1.train.checkpoint_exists(ckpt):
        raise UserError("checkpoint %s not found; checkpoints in %s: %s"
                        % (ckpt or "(none)", logdir, existing_checkpoints(logdir) or "none, train first"))
    return ckpt


def existing_checkpoints(logdir):
    """The checkpoints that logdir's index lists and whose files are there, comma-separated."""
    state = checkpoint_state(logdir)
    paths = state.all_model_checkpoint_paths if state else []
    return ", ".join(path for path in paths if tf1.train.checkpoint_exists(path))


#: Variables added to the training graph after checkpoints were first written; a checkpoint without them restores
#: with them at their initial value.
OPTIONAL_VARIABLES = (SCHEDULE_TOTAL_STEPS,)


def checkpoint_difference(ckpt):
    """How the variables of checkpoint ckpt differ from those of the default graph: a phrase, or None.

    Weights in the checkpoint that the graph lacks count too (found by their Adam slot), so that a model with
    fewer blocks never restores half of a bigger one silently.
    """
    saved = dict(tf.train.list_variables(ckpt))
    names = set()
    for variable in tf1.global_variables():
        name, shape = variable.op.name, variable.shape.as_list()
        names.add(name)
        if name not in saved and name in OPTIONAL_VARIABLES:
            continue
        if name not in saved:
            return "the model has %s %s but the checkpoint does not" % (name, shape)
        if saved[name] != shape:
            return "%s is %s in the checkpoint but %s in the model" % (name, saved[name], shape)
    extra = sorted(name for name in saved if name + "/Adam" in saved and name not in names)
    if extra:
        return "the checkpoint has %s %s but the model does not" % (extra[0], saved[extra[0]])
    return None


def unreadable_reason(ckpt):
    """Why the tensors of checkpoint ckpt can not be read (e.g. "Read less bytes than requested" for a truncated
    data file), or None if they all can."""
    try:
        reader = tf.train.load_checkpoint(ckpt)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # the reader raises OpError, IndexError, ... depending on the damage
        return str(error).strip().splitlines()[0][:200]
    return None


def restore(sess, ckpt, logdir, saver=None, follow_latest=False):
    """Restores every variable of the graph (or those of saver) from ckpt; OPTIONAL_VARIABLES that ckpt lacks are
    initialized instead. Returns the checkpoint restored: with follow_latest (ckpt was the latest, not one the user
    named), the newest one when training deleted ckpt before it could be opened.

    A truncated or unreadable checkpoint, or one whose variables differ from the model built from hparams.json,
    is a UserError that says what is wrong and lists the checkpoints that exist.
    """
    for _ in range(PIN_ATTEMPTS):
        try:
            restore_pinned(sess, ckpt, logdir, saver)
            return ckpt
        except CheckpointGone:
            if not follow_latest:
                raise
            ckpt = find_checkpoint(logdir)
    raise CheckpointGone(ckpt)


#: How many checkpoints restore(follow_latest=True) tries while training keeps deleting them before they open.
PIN_ATTEMPTS = 5


class CheckpointGone(UserError):
    """The checkpoint was deleted (training rotated it away, see --keep_checkpoints) before it could be opened."""

    def __init__(self, ckpt):
        super().__init__("checkpoint %s was deleted while it was being opened (training rotated it away, see "
                         "--keep_checkpoints): run again to read the newest one" % ckpt)


def restore_pinned(sess, ckpt, logdir, saver):
    """restore() of one checkpoint, read through pinned_checkpoint."""
    existing = existing_checkpoints(logdir) or "none"
    with pinned_checkpoint(ckpt) as path:
        try:
            difference = checkpoint_difference(path)
            if difference:
                raise UserError("%s does not match the model that %s/hparams.json describes: %s; checkpoints in "
                                "%s: %s" % (ckpt, logdir, difference, logdir, existing))
            saved = {name for name, _ in tf.train.list_variables(path)}
            missing = [v for v in tf1.global_variables() if v.op.name not in saved]
            if missing:  # only OPTIONAL_VARIABLES, which checkpoint_difference allows: start them at initial values
                sess.run(tf1.variables_initializer(missing))
                saver = tf1.train.Saver([v for v in tf1.global_variables() if v not in missing])
            (saver or tf1.train.Saver()).restore(sess, path)
        except (tf.errors.OpError, ValueError) as error:
            reason = unreadable_reason(path) or str(error).strip().splitlines()[0][:200]
            raise UserError("cannot restore %s (%s); checkpoints in %s: %s"
                            % (ckpt, reason, logdir, existing)) from None


#: Prefix of the directories in which pinned_checkpoint links a checkpoint's files, followed by the reader's pid.
PIN_PREFIX = ".reading-"


@contextlib.contextmanager
def pinned_checkpoint(ckpt):
    """Yields the path of checkpoint ckpt through hard links to its files in a private directory beside them,
    removed afterwards. While a logdir is being trained, the Saver deletes old checkpoints (--keep_checkpoints):
    the links keep the files of the one being read alive until it has been read. Where links can not be made
    (a read-only logdir, a file system without hard links), yields ckpt itself."""
    directory, name = os.path.split(os.path.abspath(ckpt))
    try:
        pin = tempfile.mkdtemp(dir=directory, prefix="%s%d-" % (PIN_PREFIX, os.getpid()))
    except OSError:
        yield ckpt
        return
    try:
        files = [path for path in glob.glob(glob.escape(ckpt) + ".*")
                 if CHECKPOINT_FILE_SUFFIX.fullmatch(path[len(ckpt):])]
        try:
            for path in files:
                os.link(path, os.path.join(pin, os.path.basename(path)))
        except FileNotFoundError:
            raise CheckpointGone(ckpt) from None
        except OSError:
            yield ckpt
            return
        if not os.path.exists(os.path.join(pin, name + ".index")):
            if os.path.exists(ckpt + ".index") or os.path.exists(ckpt):  # not a V2 checkpoint: read in place
                yield ckpt
                return
            raise CheckpointGone(ckpt)
        yield os.path.join(pin, name)
    finally:
        shutil.rmtree(pin, ignore_errors=True)


def remove_stale_pins(logdir):
    """Deletes the pinned_checkpoint directories of readers that died before removing them (killed)."""
    for path in glob.glob(os.path.join(glob.escape(logdir), PIN_PREFIX + "*")):
        pid = os.path.basename(path)[len(PIN_PREFIX):].split("-")[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, OSError):  # not ours, or a process of another user: still alive
            pass


def save_variable_specs(fpath):
    """Writes the name and shape of every trainable variable, and the total parameter count, to fpath."""
    lines, total = [], 0
    for v in tf1.trainable_variables():
        shape = v.shape.as_list()
        total += int(np.prod(shape))
        lines.append("%s %s" % (v.name, shape))
    lines.append("num_params: %d" % total)
    atomic_write(fpath, "\n".join(lines) + "\n")
    return total


def postprocess(ids, sp):
    """ids: (N, T) int array ending in </s> then 0s. Returns N detokenized strings (sentencepiece decode)."""
    texts = []
    for row in ids:
        row = list(row)
        row = row[:row.index(EOS_ID)] if EOS_ID in row else row
        texts.append(sp.decode([int(i) for i in row if i != PAD_ID]))
    return texts


def get_hypotheses(sess, init_op, ids_op, x_seqlen_op, num_batches, order, sp, desc="translating",
                   scores_op=None):
    """Translates a whole dataset, batch by batch.

    init_op initializes the iterator; ids_op gives (N, T) ids, x_seqlen_op the (N,) source lengths counting </s>,
    scores_op (if given) the (N,) scores of the translations. order: (n,) the line index of each row the batches
    give, in turn (data_load.eval_order). An empty source line (x_seqlen 1: </s> only) gets an empty hypothesis.
    Returns a list of strings, one per source line, in line order. Raises FloatingPointError when a score is not
    finite: the model's log-probabilities overflowed, although its weights may be finite.
    """
    sess.run(init_op)
    hypotheses = []
    progress = Progress(num_batches, desc, unit="batches")
    for batch in range(num_batches):
        ids, x_seqlen, *scores = sess.run([ids_op, x_seqlen_op] + ([scores_op] if scores_op is not None else []))
        if scores and not np.isfinite(scores[0]).all():
            progress.close()
            raise FloatingPointError("%s: decoding scores are not finite (batch %d of %d)"
                                     % (desc, batch + 1, num_batches))
        texts = postprocess(ids, sp)
        hypotheses.extend("" if length == 1 else text for length, text in zip(x_seqlen, texts))
        progress.update()
    progress.close()
    in_line_order = [""] * len(order)
    for line, hypothesis in zip(order, hypotheses):
        in_line_order[line] = hypothesis
    return in_line_order


#: Seconds between two progress lines of a long loop whose standard error is not a terminal (see Progress).
PROGRESS_SECONDS = 60


class Progress:
    """Progress of a long loop: a tqdm bar on standard error when it is a terminal; otherwise (a log file, a pipe,
    nohup, a batch job) a line `DESC: DONE/TOTAL UNIT (P%), S s[, POSTFIX]` on `out` every PROGRESS_SECONDS, so
    that a log shows the run is alive and how far it is."""

    def __init__(self, total, desc, initial=0, unit="steps", out=None):
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=None, leave=False)
        self.total, self.desc, self.done, self.unit, self.out = total, desc, initial, unit, out
        self.start = self.last_line = time.time()
        self.postfix = ""

    def update(self, **postfix):
        """One more unit done; postfix: values to show (e.g. loss="2.31")."""
        self.done += 1
        self.bar.update(1)
        if postfix:
            self.bar.set_postfix(**postfix)
            self.postfix = ", ".join("%s %s" % item for item in postfix.items())
        now = time.time()
        if self.bar.disable and now - self.last_line >= PROGRESS_SECONDS:
            self.last_line = now
            print("%s: %d/%d %s (%.0f%%), %.0f s%s" % (
                self.desc, self.done, self.total, self.unit, 100.0 * self.done / max(self.total, 1),
                now - self.start, ", " + self.postfix if self.postfix else ""), file=self.out or sys.stdout,
                flush=True)

    def close(self):
        self.bar.close()


def calc_bleu(references, hypotheses):
    """sacreBLEU over detokenized, cased text. Returns (score, signature string)."""
    if len(references) != len(hypotheses):
        raise ValueError("%d references but %d hypotheses" % (len(references), len(hypotheses)))
    if not references:  # sacreBLEU has no signature before it scores something
        return 0.0, "no sentences"
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references]).score
    return (0.0 if math.isnan(score) else score), str(bleu.get_signature())
