"""Helpers shared by train.py, test.py and translate.py: hyperparameter files, atomic writes, turning ids into
text, translating a whole dataset, and BLEU.

BLEU is sacreBLEU on detokenized, cased text (the scoring that published numbers can be compared with).
"""
import hashlib
import json
import math
import os
import sys
import tempfile
from argparse import Namespace

import numpy as np
import sacrebleu
import tensorflow as tf
from tqdm import tqdm

import runtime
from data_load import EOS_ID, PAD_ID
from hparams import LEGACY_VALUES, MODEL_FLAGS, Hparams, explicit_flags
from model import SCHEDULE_TOTAL_STEPS

tf1 = tf.compat.v1


class UserError(Exception):
    """A problem the user can fix (bad flag, missing file, mismatched logdir): reported as one line, no traceback."""


def run_cli(main):
    """Runs main() and exits with its code; a UserError becomes one line on stderr and exit code 2, a Ctrl-C that
    main() does not handle itself one line and exit code 130."""
    try:
        sys.exit(main())
    except UserError as error:
        print("error: %s" % error, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def atomic_write(path, text):
    """Writes text to path through a temporary file in the same directory and os.replace, so that a reader
    (or a kill -9) sees either the old or the new file, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def session_config(hp):
    """Session settings: intra-op threads from --threads (0: every core), one inter-op thread per two cores."""
    return tf1.ConfigProto(intra_op_parallelism_threads=hp.threads,
                           inter_op_parallelism_threads=max(1, (hp.threads or os.cpu_count() or 2) // 2))


def save_hparams(hp, path):
    """Writes the namespace hp as hparams.json in the directory path."""
    atomic_write(os.path.join(path, "hparams.json"), json.dumps(vars(hp), indent=2, sort_keys=True) + "\n")


def load_hparams(path):
    """Reads hparams.json from the directory path into a Namespace."""
    fpath = os.path.join(path, "hparams.json")
    if not os.path.exists(fpath):
        raise UserError("%s not found: is %s a logdir written by train.py?" % (fpath, path))
    with open(fpath, encoding="utf-8") as f:
        return Namespace(**json.load(f))


def merge_hparams(logdir, given):
    """LOGDIR/hparams.json with the flags in `given` (a dict of explicitly given flags) on top; flags added to
    hparams.py since it was written get the value they stood for then (LEGACY_VALUES) or their defaults.
    trained_data_dir is the data_dir it was trained on.
    Returns the namespace and the model-shape flags given with another value, as (flag, saved, given) tuples."""
    saved = {**LEGACY_VALUES, **vars(load_hparams(logdir))}
    conflicts = [(flag, saved[flag], given[flag]) for flag in MODEL_FLAGS
                 if flag in given and given[flag] != saved.get(flag)]
    hp = Hparams().parser.parse_args([], namespace=Namespace(**{**saved, **given}))
    hp.trained_data_dir = saved["data_dir"]
    return hp, conflicts


def restore_hparams(argv):
    """Hyperparameters of a trained model: LOGDIR/hparams.json with the flags given on the command line on top
    (decoding, testing, data_dir). The model's shape always comes from hparams.json."""
    given = explicit_flags(argv)
    logdir = given.get("logdir", Hparams().parser.get_default("logdir"))
    hp, conflicts = merge_hparams(logdir, given)
    for flag, saved, asked in conflicts[:1]:
        raise UserError("the model in %s has --%s %s (from its hparams.json); drop --%s %s"
                        % (logdir, flag, saved, flag, asked))
    resolve_precision(hp)
    return hp


def resolve_precision(hp):
    """Replaces hp.precision "auto" by what this machine runs fastest (runtime.choose_precision) and prints the
    choice; prints a warning for an explicit bf16 that this CPU can only emulate."""
    _, flags = runtime.cpu_info()
    hp.precision, note = runtime.choose_precision(hp.precision, flags, os.environ.get("ONEDNN_MAX_CPU_ISA"),
                                                  bool(tf.config.list_physical_devices("GPU")))
    if note:
        print(note, file=sys.stderr)  # stderr: translate.py's stdout carries translations


def trained_model_files(hp, ckpt=""):
    """The manifest of hp.data_dir and the checkpoint to restore (ckpt, or the latest in hp.logdir), after
    checking that the data dir's vocabulary is the one the model was trained with."""
    manifest = load_manifest(hp.data_dir)
    check_vocab(hp, manifest, hp.trained_data_dir)
    return manifest, find_checkpoint(hp.logdir, ckpt)


def vocab_sha256(data_dir, manifest):
    """sha256 of data_dir's BPE vocabulary file: two vocabularies of the same size can still differ."""
    with open(os.path.join(data_dir, manifest["bpe_vocab"]), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_vocab(hp, manifest, trained_data_dir):
    """A model can only read a data dir whose vocabulary it was trained with: same size and, where hparams.json
    records it (vocab_sha256), the same pieces."""
    if manifest["vocab_size"] != hp.vocab_size:
        raise UserError("vocab size %d of %s does not match vocab size %d of the model in %s: pass the --data_dir "
                        "it was trained on (%s)" % (manifest["vocab_size"], hp.data_dir, hp.vocab_size, hp.logdir,
                                                    trained_data_dir))
    if getattr(hp, "vocab_sha256", None) not in (None, vocab_sha256(hp.data_dir, manifest)):
        raise UserError("the BPE vocabulary of %s has the model's size %d but other pieces than the one the model "
                        "in %s was trained with: pass the --data_dir it was trained on (%s)"
                        % (hp.data_dir, hp.vocab_size, hp.logdir, trained_data_dir))


#: Name prefix of the checkpoints avg_checkpoints.py writes; training resumes from its own checkpoints only.
AVERAGED_PREFIX = "avg_"


def is_averaged(ckpt):
    """Whether the checkpoint path ckpt was written by avg_checkpoints.py."""
    return os.path.basename(ckpt).startswith(AVERAGED_PREFIX)


def find_checkpoint(logdir, ckpt=""):
    """The checkpoint to restore: ckpt if given, else the latest in logdir. A missing one is a UserError that
    lists the checkpoints that do exist."""
    state = tf1.train.get_checkpoint_state(logdir)
    ckpt = ckpt or (state.model_checkpoint_path if state else "")
    if not ckpt or not tf1.train.checkpoint_exists(ckpt):
        raise UserError("checkpoint %s not found; checkpoints in %s: %s"
                        % (ckpt or "(none)", logdir, existing_checkpoints(logdir) or "none, train first"))
    return ckpt


def existing_checkpoints(logdir):
    """The checkpoints that logdir's index lists and whose files are there, comma-separated."""
    state = tf1.train.get_checkpoint_state(logdir)
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


def restore(sess, ckpt, logdir, saver=None):
    """Restores every variable of the graph (or those of saver) from ckpt; OPTIONAL_VARIABLES that ckpt lacks are
    initialized instead.

    A truncated or unreadable checkpoint, or one whose variables differ from the model built from hparams.json,
    is a UserError that says what is wrong and lists the checkpoints that exist.
    """
    existing = existing_checkpoints(logdir) or "none"
    try:
        difference = checkpoint_difference(ckpt)
        if difference:
            raise UserError("%s does not match the model that %s/hparams.json describes: %s; checkpoints in %s: %s"
                            % (ckpt, logdir, difference, logdir, existing))
        saved = {name for name, _ in tf.train.list_variables(ckpt)}
        missing = [v for v in tf1.global_variables() if v.op.name not in saved]
        if missing:  # only OPTIONAL_VARIABLES, which checkpoint_difference allows: start them at their initial value
            sess.run(tf1.variables_initializer(missing))
            saver = tf1.train.Saver([v for v in tf1.global_variables() if v not in missing])
        (saver or tf1.train.Saver()).restore(sess, ckpt)
    except (tf.errors.OpError, ValueError) as error:
        reason = unreadable_reason(ckpt) or str(error).strip().splitlines()[0][:200]
        raise UserError("cannot restore %s (%s); checkpoints in %s: %s" % (ckpt, reason, logdir, existing)) from None


def load_manifest(data_dir):
    """Reads data_dir/manifest.json, written last by prepro.py."""
    fpath = os.path.join(data_dir, "manifest.json")
    if not os.path.exists(fpath):
        raise UserError("%s not found: run `python prepro.py --data_dir %s` first" % (fpath, data_dir))
    with open(fpath, encoding="utf-8") as f:
        return json.load(f)


def split_paths(data_dir, manifest, split):
    """Absolute paths of a split's files: dict with raw1, raw2, bpe1, bpe2."""
    files = manifest["splits"][split]
    return {key: os.path.join(data_dir, files[key]) for key in ("raw1", "raw2", "bpe1", "bpe2")}


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


def get_hypotheses(sess, init_op, ids_op, sents1_op, num_batches, sp, desc="translating"):
    """Translates a whole dataset, batch by batch, in order.

    init_op initializes the iterator; ids_op gives (N, T) ids, sents1_op the (N,) source strings.
    An empty source line gets an empty hypothesis. Returns a list of strings, one per source line.
    """
    sess.run(init_op)
    hypotheses = []
    for _ in tqdm(range(num_batches), desc=desc, leave=False, disable=None):
        ids, sents1 = sess.run([ids_op, sents1_op])
        texts = postprocess(ids, sp)
        hypotheses.extend("" if not s.strip() else t for s, t in zip(sents1, texts))
    return hypotheses


def read_lines(fpath):
    """Lines of a UTF-8 text file without their line endings."""
    with open(fpath, encoding="utf-8") as f:
        return f.read().splitlines()


def calc_bleu(references, hypotheses):
    """sacreBLEU over detokenized, cased text. Returns (score, signature string)."""
    if len(references) != len(hypotheses):
        raise ValueError("%d references but %d hypotheses" % (len(references), len(hypotheses)))
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references]).score
    return (0.0 if math.isnan(score) else score), str(bleu.get_signature())
