"""A training logdir: the one module that reads and writes its files (docs/checkpoint-format.md
lists them).

    hparams.json         the flags the model was trained with and its data dir's fingerprint
    specs.txt            the name and shape of every trainable variable
    train.lock           held by the process that writes the logdir
    checkpoint           TensorFlow's index of the checkpoints, the latest last
    NAME-STEP.*          a checkpoint of train.py; avg_*-STEP.* one of avg_checkpoints.py
    best-STEP.*, best.json  the best checkpoint by dev BLEU, kept out of the rotation, and its step,
                            BLEU and
                         the dev evaluations without gain since (--patience)
    events.out.tfevents.*  the summaries TensorBoard reads
    REJECTED.json        not to be used, and why: a fine-tune on suggestions not judged yet, or
                         rejected (train.py --suggestions); the tools that decode refuse the logdir

train.py writes a logdir (avg_checkpoints.py adds to it); test.py, translate.py and export.py read
it and take no lock, pinning the checkpoint they read while training may rotate it away. What a
killed run or a full disk leaves half-written (a checkpoint's temporary files, a dead reader's pins,
a torn summary record) is removed or cut off here too.
"""
import contextlib
import functools
import glob
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from argparse import Namespace

import numpy as np
import tensorflow as tf

from toolkit.data import datadir
from toolkit.base.errors import UserError
from hparams import (HPARAMS_NAME, LEGACY_VALUES, MODEL_FLAGS, RECORDED_TYPES, Hparams,
                     check_ranges, range_error, type_error)
from model import SCHEDULE_TOTAL_STEPS
from toolkit.base.writing import exclusive_lock, process_description
from toolkit.base.writing import atomic_write, write_json
from toolkit.base.writing import remove_stale
from toolkit.base.reading import check_types, read_json

tf1 = tf.compat.v1


#: The lock file of a logdir, held by the train.py that trains it (or avg_checkpoints.py while it
#: writes the checkpoint index); it names that process.
LOCK_NAME = "train.lock"


@contextlib.contextmanager
def logdir_lock(logdir, tool="train.py"):
    """Holds an exclusive lock (fcntl.flock) on LOGDIR/train.lock while `tool` writes the logdir, so
    that two processes never write one logdir: a second one is refused with a UserError naming the
    process that holds the lock. The kernel releases the lock when the process ends however it ends
    (SIGKILL too), so a lock file left behind never blocks a later run. Readers (test.py,
    translate.py, export.py) take no lock."""
    with exclusive_lock(os.path.join(logdir, LOCK_NAME), process_description(tool),
                        lambda holder: "%s is being written by %s: wait for it to end, stop it, or "
                                       "use another --logdir" % (logdir, holder)):
        yield


# ----------------------------------------------------------------------------------------------
# hparams.json and specs.txt


def save_hparams(hp, path):
    """Writes the namespace hp as hparams.json in the directory path."""
    atomic_write(os.path.join(path, HPARAMS_NAME), json.dumps(vars(hp), indent=2, sort_keys=True)
                 + "\n")


def saved_hparams(logdir):
    """LOGDIR/hparams.json as train.py wrote it (a dict), its types and ranges checked; a UserError
    saying what to do when it is missing or damaged."""
    fpath = os.path.join(logdir, HPARAMS_NAME)
    if not os.path.exists(fpath):
        raise UserError("%s not found: is %s a logdir written by train.py?" % (fpath, logdir))
    saved = read_json(fpath, "it was damaged; restore it from a copy, or write it again with the "
                             "flags the model was trained with (see %s/specs.txt for its "
                             "shape)" % logdir)
    if not isinstance(saved, dict):
        raise UserError("%s is not valid JSON for hyperparameters (not an object): restore it from "
                        "a copy" % fpath)
    problem = (keys_error(saved, fpath) or type_error(saved, fpath)
               or range_error(Namespace(**saved), saved, where=fpath))
    if problem:
        raise UserError(problem)
    return saved


#: The keys every hparams.json has held since the first release: the data dir and the model's shape.
REQUIRED_KEYS = ("data_dir",) + MODEL_FLAGS


def keys_error(saved, fpath):
    """The first key of a hparams.json dict (read from fpath) that no flag or record of train.py has
    (a renamed key), or the first of REQUIRED_KEYS it lacks, as one sentence naming the file and the
    key; None when all fit."""
    known = {action.dest for action in Hparams().parser._actions} | set(RECORDED_TYPES)
    unknown = sorted(set(saved) - known)
    if unknown:
        return ("%s: %s is not a key train.py writes (a renamed flag?): fix it, or restore the "
                "file from a copy" % (fpath, unknown[0]))
    missing = [key for key in REQUIRED_KEYS if key not in saved]
    if missing:
        return ("%s: the key %s is missing: add it back, or restore the file from a copy"
                % (fpath, missing[0]))
    return None


def check_hparams_present(logdir):
    """Refuses a logdir that holds checkpoints but no hparams.json (deleted): a run that wrote one
    from its own flags would train over checkpoints of another model's shape."""
    state = checkpoint_state(logdir) if os.path.isdir(logdir) else None
    if state and not os.path.exists(os.path.join(logdir, HPARAMS_NAME)):
        raise UserError("%s holds checkpoints (%s) but no %s, which says what model they hold: "
                        "restore it from a copy, or use another --logdir"
                        % (logdir, os.path.basename(state.model_checkpoint_path),
                                                           HPARAMS_NAME))


def trained_data_dir(logdir):
    """The data dir the model in logdir was trained on, as its hparams.json names it (relative to
    where train.py ran): a data dir given now must have its vocabulary (datadir.check_vocab)."""
    return saved_hparams(logdir)["data_dir"]


def load_trained_hparams(logdir, overrides):
    """The hyperparameters of the model trained in logdir: LOGDIR/hparams.json with `overrides` (a
    dict of flags the user gave, e.g. the second value of hparams.parse_flags) on top, their ranges
    checked. Flags added to hparams.py since it was written get the value they stood for then
    (hparams.LEGACY_VALUES) or their defaults. An override of the model's shape
    (hparams.MODEL_FLAGS) with another value is a UserError: the checkpoints hold that shape."""
    saved = {**LEGACY_VALUES, **saved_hparams(logdir)}
    for flag in MODEL_FLAGS:
        if flag in overrides and overrides[flag] != saved.get(flag):
            raise UserError("%s holds a model with --%s %s but this run asks for %s: use another "
                            "--logdir" % (logdir, flag, saved.get(flag), overrides[flag]))
    hp = Hparams().parser.parse_args([], namespace=Namespace(
        **{**saved, **overrides, "logdir": logdir}))  # the defaults of flags that neither gives
    check_ranges(hp, overrides)
    return hp


def save_variable_specs(logdir):
    """Writes the name and shape of every trainable variable, and the total parameter count,
    to LOGDIR/specs.txt. Returns the count."""
    lines, total = [], 0
    for v in tf1.trainable_variables():
        shape = v.shape.as_list()
        total += int(np.prod(shape))
        lines.append("%s %s" % (v.name, shape))
    lines.append("num_params: %d" % total)
    atomic_write(os.path.join(logdir, "specs.txt"), "\n".join(lines) + "\n")
    return total


# ----------------------------------------------------------------------------------------------
# Checkpoints


def trained_model_files(hp, ckpt="", splits=()):
    """The manifest of hp.data_dir and the checkpoint to restore (ckpt, or the latest in hp.logdir),
    after checking the data dir's files (those of `splits` too), that the data dir's vocabulary is
    the one the model was trained with and that the checkpoint holds trained weights."""
    trained_on = trained_data_dir(hp.logdir)
    manifest = datadir.load_manifest(hp.data_dir, trained_on, hp.logdir, splits)
    datadir.check_vocab(hp, manifest, trained_on)
    ckpt = find_checkpoint(hp.logdir, ckpt)
    check_trained(ckpt, hp.logdir)
    check_not_rejected(hp.logdir)
    return manifest, ckpt


#: The file that marks a logdir not to be used, and why: train.py --suggestions writes it before it
#: trains (not judged yet) and leaves it when its gate rejects the fine-tune (corrections.py).
REJECTED_NAME = "REJECTED.json"


def mark_rejected(logdir, reason, remedy, **details):
    """Marks logdir rejected (REJECTED_NAME): the reason, what to do, and details for people."""
    write_json(os.path.join(logdir, REJECTED_NAME), {"reason": reason, "remedy": remedy,
                                                     **details})


def clear_rejected(logdir):
    """Removes the mark of mark_rejected, if any."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(logdir, REJECTED_NAME))


def check_not_rejected(logdir):
    """Refuses a logdir marked rejected (REJECTED_NAME), with its reason and what to do: the tools
    that translate with a model never serve one by mistake."""
    path = os.path.join(logdir, REJECTED_NAME)
    if not os.path.lexists(path):
        return
    try:
        record = read_json(path, "")
    except UserError:
        record = None
    record = record if isinstance(record, dict) else {}
    raise UserError("%s is marked rejected (%s): %s; %s" % (
        logdir, path, record.get("reason", "no reason recorded"),
        record.get("remedy", "delete %s to use it anyway" % path)))


def check_trained(ckpt, logdir):
    """Refuses a checkpoint of global step 0, whose weights are the random initial ones (earlier
    versions of train.py saved one when interrupted before the first step)."""
    try:
        step = tf.train.load_checkpoint(ckpt).get_tensor("global_step")
    # an unreadable checkpoint is reported by restore(), with the reason
    except Exception:  # noqa: BLE001
        return
    if step == 0:
        raise UserError("%s holds untrained weights (global step 0: a run interrupted before its "
                        "first step saved it): train first, or pass another --ckpt; checkpoints in "
                        "%s: %s" % (ckpt, logdir, existing_checkpoints(logdir)))


def open_checkpoint(ckpt, remedy):
    """A reader of ckpt and its variables {name: (shape tuple, tf.DType)}; one that can not be read
    (a truncated .index, a file that is no checkpoint) is a UserError naming it and ``remedy``."""
    with reading(ckpt, remedy):
        reader = tf.train.load_checkpoint(ckpt)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    return reader, {name: (tuple(shapes[name]), dtypes[name]) for name in shapes}


@contextlib.contextmanager
def reading(ckpt, remedy):
    """A checkpoint whose files can not be read (an .index or .data file cut short, damaged, not a
    checkpoint) while the block reads it is a UserError naming it, the reader's reason
    and ``remedy``."""
    try:
        yield
    # the reader raises OpError, IndexError, ... depending on the damage
    except Exception as error:  # noqa: BLE001
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UserError("cannot read checkpoint %s (%s): it is damaged; %s"
                        % (ckpt, reason, remedy)) from None


def check_readable(ckpt, remedy):
    """Reads every tensor of ckpt, one at a time: a damaged checkpoint is refused (open_checkpoint,
    reading) before a run that needs it writes anything."""
    reader, variables = open_checkpoint(ckpt, remedy)
    with reading(ckpt, remedy):
        for name in variables:
            reader.get_tensor(name)


#: Name prefix of the checkpoints avg_checkpoints.py writes; training resumes from its own
#: checkpoints only.
AVERAGED_PREFIX = "avg_"


def is_averaged(ckpt):
    """Whether the checkpoint path ckpt was written by avg_checkpoints.py."""
    return os.path.basename(ckpt).startswith(AVERAGED_PREFIX)


#: What follows a checkpoint's name in the names of its files
#: (a user may pass --ckpt with one of them).
CHECKPOINT_FILE_SUFFIX = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")

#: The name of a file TensorFlow writes a checkpoint file through (renamed into place when
#: complete): the checkpoint file's name, ".tempstate" and a random number.
PARTIAL_CHECKPOINT_FILE = re.compile(r".+\.(index|meta|data-\d{5}-of-\d{5})\.tempstate\d+")


def checkpoint_state(logdir):
    """The CheckpointState of logdir's index file (LOGDIR/checkpoint), None if logdir has no
    checkpoint. The checkpoints on disk are the truth: an index that is missing, empty or damaged
    while checkpoints are there is rebuilt from them (checkpoints_on_disk), never taken for a logdir
    without any (training would start over)."""
    try:
        state = tf1.train.get_checkpoint_state(logdir)
    except ValueError:  # an empty index
        state = None
    if state is not None and state.model_checkpoint_path:
        return state
    return checkpoints_on_disk(logdir)


#: The global step at the end of a checkpoint's name (NAME-STEP).
CHECKPOINT_STEP = re.compile(r"-(\d+)$")


def checkpoints_on_disk(logdir):
    """A CheckpointState listing the checkpoints in logdir (their .index files), oldest first by
    global step (then by time), with a note on stderr naming the newest; None when there is none.
    The best checkpoint (BEST-STEP), which the index never lists, counts only when no other
    is left."""
    names = [name[:-len(".index")] for name in os.listdir(logdir)
             if name.endswith(".index")] if os.path.isdir(
        logdir) else []
    names = [name for name in names if not name.startswith(BEST + "-")] or names
    paths = sorted((os.path.join(logdir, name) for name in names if CHECKPOINT_STEP.search(name)),
                   key=lambda path: (int(CHECKPOINT_STEP.search(path).group(1)),
                                     os.path.getmtime(path + ".index")))
    if not paths:
        return None
    note_rebuilt_index(os.path.join(logdir, "checkpoint"), paths[-1])
    # paths as given
    return tf1.train.generate_checkpoint_state_proto(os.path.abspath(logdir), paths[-1], paths)


@functools.lru_cache(maxsize=None)
def note_rebuilt_index(index, newest):
    """Says once per process that the checkpoint index was rebuilt from the checkpoints on disk."""
    print("note: %s is missing or damaged; the checkpoints on disk are used, the newest %s"
          % (index, newest), file=sys.stderr)


def find_checkpoint(logdir, ckpt=""):
    """The checkpoint to restore: ckpt if given (the name of one of its files works too; best or
    DIR/best: the best by dev BLEU, best_checkpoint), else the latest in logdir. A missing one is a
    UserError that lists the checkpoints that do exist."""
    ckpt = CHECKPOINT_FILE_SUFFIX.sub("", ckpt)
    if os.path.basename(ckpt) == BEST:
        ckpt = best_checkpoint(os.path.dirname(ckpt) or logdir)
    state = checkpoint_state(logdir) if not ckpt else None
    ckpt = ckpt or (state.model_checkpoint_path if state else "")
    if not ckpt or not tf1.train.checkpoint_exists(ckpt):
        raise UserError("checkpoint %s not found; checkpoints in %s: %s"
                        % (ckpt or "(none)", logdir, existing_checkpoints(logdir) or "none, train "
                           "first"))
    return ckpt


def existing_checkpoints(logdir):
    """The checkpoints that logdir's index lists and whose files are there, comma-separated."""
    state = checkpoint_state(logdir)
    paths = state.all_model_checkpoint_paths if state else []
    return ", ".join(path for path in paths if tf1.train.checkpoint_exists(path))


#: Variables added to the training graph after checkpoints were first written; a checkpoint without
#: them restores with them at their initial value.
OPTIONAL_VARIABLES = (SCHEDULE_TOTAL_STEPS,)


def checkpoint_names(variables=None):
    """{name in a checkpoint: variable} of variables: a list, each under its own name (default:
    every variable of the default graph), or such a dict already (a model built in a variable
    scope, restored from its own checkpoint)."""
    if isinstance(variables, dict):
        return variables
    return {v.op.name: v for v in (tf1.global_variables() if variables is None else variables)}


def checkpoint_difference(ckpt, variables=None):
    """How the variables of checkpoint ckpt differ from those of the default graph (or from
    `variables`, as checkpoint_names takes them): a phrase, or None.

    Weights in the checkpoint that the graph lacks count too (found by their Adam slot), so that a
    model with fewer blocks never restores half of a bigger one silently.
    """
    saved = dict(tf.train.list_variables(ckpt))
    names = set()
    for name, variable in checkpoint_names(variables).items():
        shape = variable.shape.as_list()
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
    """Why the tensors of checkpoint ckpt can not be read (e.g. "Read less bytes than requested" for
    a truncated data file), or None if they all can."""
    try:
        reader = tf.train.load_checkpoint(ckpt)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # the reader raises OpError, IndexError, ... depending on the damage
        return str(error).strip().splitlines()[0][:200]
    return None


def restore(sess, ckpt, logdir, saver=None, follow_latest=False, variables=None):
    """Restores every variable of the graph (or those of saver, or `variables`: a list, or {name in
    ckpt: variable}, see checkpoint_names) from ckpt; OPTIONAL_VARIABLES that ckpt lacks are
    initialized instead. Returns the checkpoint restored: with follow_latest (ckpt was the latest,
    not one the user named), the newest one when training deleted ckpt before it could be opened.

    A truncated or unreadable checkpoint, or one whose variables differ from the model built from
    hparams.json, is a UserError that says what is wrong and lists the checkpoints that exist.
    """
    for _ in range(PIN_ATTEMPTS):
        try:
            restore_pinned(sess, ckpt, logdir, saver, variables)
            return ckpt
        except CheckpointGone:
            if not follow_latest:
                raise
            ckpt = find_checkpoint(logdir)
    raise CheckpointGone(ckpt)


#: How many checkpoints restore(follow_latest=True) tries while training keeps deleting them before
#: they open.
PIN_ATTEMPTS = 5


class CheckpointGone(UserError):
    """The checkpoint was deleted (training rotated it away, see --keep_checkpoints) before it could
    be opened."""

    def __init__(self, ckpt):
        super().__init__("checkpoint %s was deleted while it was being opened (training rotated it "
                         "away, see --keep_checkpoints): run again to read the newest one" % ckpt)


def restore_pinned(sess, ckpt, logdir, saver, variables=None):
    """restore() of one checkpoint, read through pinned_checkpoint."""
    existing = existing_checkpoints(logdir) or "none"
    named = checkpoint_names(variables)
    with pinned_checkpoint(ckpt) as path:
        try:
            difference = checkpoint_difference(path, named)
            if difference:
                raise UserError("%s does not match the model that %s/hparams.json describes: %s; "
                                "checkpoints in %s: %s"
                                % (ckpt, logdir, difference, logdir, existing))
            saved = {name for name, _ in tf.train.list_variables(path)}
            missing = [name for name in named if name not in saved]
            # only OPTIONAL_VARIABLES, which checkpoint_difference allows: start them at
            # initial values
            if missing:
                sess.run(tf1.variables_initializer([named[name] for name in missing]))
                saver = tf1.train.Saver({name: variable for name, variable in named.items()
                                         if name not in missing})
            elif variables is not None:
                saver = saver or tf1.train.Saver(named)
            (saver or tf1.train.Saver()).restore(sess, path)
        except (tf.errors.OpError, ValueError) as error:
            reason = unreadable_reason(path) or str(error).strip().splitlines()[0][:200]
            raise UserError("cannot restore %s (%s); checkpoints in %s: %s"
                            % (ckpt, reason, logdir, existing)) from None


#: Prefix of the directories in which pinned_checkpoint links a checkpoint's files, followed by the
#: reader's pid.
PIN_PREFIX = ".reading-"


@contextlib.contextmanager
def pinned_checkpoint(ckpt):
    """Yields the path of checkpoint ckpt through hard links to its files in a private directory
    beside them, removed afterwards. While a logdir is being trained, the Saver deletes old
    checkpoints (--keep_checkpoints): the links keep the files of the one being read alive until it
    has been read. Where links can not be made (a read-only logdir, a file system without hard
    links), yields ckpt itself."""
    directory, name = os.path.split(os.path.abspath(ckpt))
    try:
        pin = tempfile.mkdtemp(dir=directory, prefix="%s%d-" % (PIN_PREFIX, os.getpid()))
    except OSError:
        yield ckpt
        return
    try:
        try:
            for path in checkpoint_files(ckpt):
                os.link(path, os.path.join(pin, os.path.basename(path)))
        except FileNotFoundError:
            raise CheckpointGone(ckpt) from None
        except OSError:
            yield ckpt
            return
        if not os.path.exists(os.path.join(pin, name + ".index")):
            # not a V2 checkpoint: read in place
            if os.path.exists(ckpt + ".index") or os.path.exists(ckpt):
                yield ckpt
                return
            raise CheckpointGone(ckpt)
        yield os.path.join(pin, name)
    finally:
        shutil.rmtree(pin, ignore_errors=True)


def checkpoint_files(ckpt):
    """The paths of the files of checkpoint ckpt (its .index, .data-* and .meta)."""
    return [path for path in glob.glob(glob.escape(ckpt) + ".*")
            if CHECKPOINT_FILE_SUFFIX.fullmatch(path[len(ckpt):])]


def remove_stale_pins(logdir):
    """Deletes the pinned_checkpoint directories of readers that died before
    removing them (killed)."""
    remove_stale(logdir, PIN_PREFIX)


def remove_partial_checkpoints(logdir, prefix=None):
    """Deletes the temporary files of a checkpoint whose writing was killed or failed (TensorFlow's
    PARTIAL_CHECKPOINT_FILE names and PREFIX_temp directories), the directories of readers killed
    while pinning a checkpoint, and, given a prefix (LOGDIR/NAME-STEP), every file of that
    checkpoint. Other files of the logdir are the user's: kept whatever their names."""
    for path in glob.glob(os.path.join(glob.escape(logdir), "*")):
        if PARTIAL_CHECKPOINT_FILE.fullmatch(os.path.basename(path)) or (
                prefix and path.startswith(prefix + "_temp")):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    for path in checkpoint_files(prefix) if prefix else ():
        os.remove(path)
    remove_stale_pins(logdir)


# ----------------------------------------------------------------------------------------------
# The events file


def whole_records_size(path):
    """The length of the leading part of a TFRecord file (an events file) made of whole records:
    each is an 8-byte length, a 4-byte checksum, the data and a 4-byte checksum. A write cut short
    (a full disk) leaves a torn record after it."""
    size, offset = os.path.getsize(path), 0
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return offset
            end = offset + 12 + struct.unpack("<Q", header[:8])[0] + 4
            if end > size:
                return offset
            offset = end
            f.seek(offset)


class NullWriter:
    """Stands in for tf1.summary.FileWriter on the processes that are not
    the chief (distributed.py)."""

    def add_summary(self, summary, step):
        """Drops summary."""

    def flush(self):
        """Nothing to flush."""

    def close(self):
        """Nothing to close."""


class EventsFile:
    """The summary writer of a run (None: a worker that writes no summaries)
    and the events file it writes."""

    def __init__(self, logdir=None, graph=None):
        if logdir is None:
            self.writer, self.path = NullWriter(), None
            return
        pattern = os.path.join(glob.escape(logdir), "events.out.tfevents.*")
        before = set(glob.glob(pattern))
        self.writer = tf1.summary.FileWriter(logdir, graph)
        self.writer.flush()
        self.path = max(set(glob.glob(pattern)) - before, key=os.path.getmtime, default=None)

    def cut_off(self):
        """After a full disk: closes the writer (its failed write raises again) and cuts off a torn
        last record."""
        try:
            self.writer.close()
        # whatever the writer thread failed with, the file is repaired below
        except Exception:  # noqa: BLE001
            pass
        if self.path and os.path.exists(self.path):
            os.truncate(self.path, whole_records_size(self.path))


# ----------------------------------------------------------------------------------------------
# The best checkpoint by dev BLEU, and the weights of another run


#: The name of the best checkpoint (BEST-STEP, kept beside the ones that --keep_checkpoints
#: rotates), as --ckpt takes it, and of the file that names it, with its values' types.
BEST, BEST_JSON = "best", "best.json"
BEST_SCHEMA = {"step": int, "bleu": (float, int), "checkpoint": str, "evals_without_gain": int}


def read_best(logdir):
    """LOGDIR/best.json as a dict, or None before the first dev evaluation."""
    fpath = os.path.join(logdir, BEST_JSON)
    if not os.path.exists(fpath):
        return None
    best = read_json(fpath, "delete it: the next dev evaluation of train.py writes it again")
    if not isinstance(best, dict) or not set(BEST_SCHEMA) <= set(best):
        raise UserError("%s is not a best.json written by train.py: delete it, the next dev "
                        "evaluation writes it again" % fpath)
    check_types(best, BEST_SCHEMA, fpath, "fix it, or delete it: the next dev evaluation of "
                                          "train.py writes it again")
    return best


def best_checkpoint(logdir):
    """The path of the best checkpoint by dev BLEU of logdir (see record_dev_bleu)."""
    best = read_best(logdir)
    if best is None:
        raise UserError("--ckpt best: %s has no %s yet: train.py writes it at the first dev "
                        "evaluation; checkpoints in %s: %s"
                        % (logdir, BEST_JSON, logdir, existing_checkpoints(logdir) or "none"))
    return os.path.join(logdir, best["checkpoint"])


def record_dev_bleu(logdir, ckpt, step, bleu):
    """After a dev evaluation of the weights saved as ckpt (at global step `step`): a better BLEU
    than best.json's makes ckpt the best, hard-linked (or copied) as LOGDIR/best-STEP, out of reach
    of the Saver's rotation; else one more evaluation without gain is counted. best.json is written
    atomically after the new files and before the old best's are removed, so it always names a
    complete checkpoint. Only the files of the checkpoint best.json named are removed, by their
    exact names: whatever else starts with best- in the logdir is the user's. Returns the new
    best.json dict."""
    best = read_best(logdir)
    previous = best and best["checkpoint"]
    if best is not None and bleu <= best["bleu"]:
        best = {**best, "evals_without_gain": best["evals_without_gain"] + 1}
    else:
        name = "%s-%d" % (BEST, step)
        for path in checkpoint_files(ckpt):
            link_or_copy(path, os.path.join(logdir, name + path[len(ckpt):]))
        best = {"step": int(step), "bleu": float(bleu), "checkpoint": name, "evals_without_gain": 0}
    atomic_write(os.path.join(logdir, BEST_JSON), json.dumps(best, indent=2) + "\n")
    if previous not in (None, best["checkpoint"]):
        for path in checkpoint_files(os.path.join(logdir, previous)):
            os.remove(path)
    return best


def link_or_copy(source, target):
    """Makes target a hard link to source (a copy where links can not be made),
    replacing target at once."""
    temporary = "%s.%d.tmp" % (target, os.getpid())
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)


def check_weights_fit(ckpt, what):
    """Raises a UserError naming the difference if the weights of ckpt differ in name or shape from
    the model's (the trainable variables of the default graph); what: where ckpt came from."""
    with pinned_checkpoint(ckpt) as path:
        difference = checkpoint_difference(path, tf1.trainable_variables())
    if difference:
        raise UserError("%s does not fit the model of this run: %s" % (what, difference))


def restore_weights(sess, ckpt, what):
    """Restores the model's weights (the trainable variables: embeddings, encoder and decoder) from
    ckpt and nothing else: global step, optimizer slots and schedule keep their initial values. A
    checkpoint whose weights do not fit is a UserError (check_weights_fit)."""
    check_weights_fit(ckpt, what)
    with pinned_checkpoint(ckpt) as path:
        tf1.train.Saver(tf1.trainable_variables()).restore(sess, path)
