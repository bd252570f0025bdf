"""train.py's flags that come from elsewhere than its command line: --config FILE (another run's
hparams.json, or a JSON object of flag values) and --init_from (the model shape and vocabulary of
the run a new one starts from)."""
import os
import sys
from argparse import Namespace

from hparams import MODEL_FLAGS, Hparams, range_error, type_error
from toolkit.data.datadir import BPE_MODEL
from toolkit.base.errors import UserError
from toolkit.training.logdir import (HPARAMS_NAME, check_readable, check_trained, find_checkpoint,
                                     load_trained_hparams, saved_hparams)
from toolkit.base.writing import same_file
from toolkit.base.reading import read_json


#: Keys of a hparams.json that --config passes over: the data dir's fingerprint (train.py records
#: the data dir's own), the run's logdir (a new run's comes from the command line) and the file that
#: run itself was given.
CONFIG_SKIPPED = ("vocab_size", "vocab_sha256", "bpe_sha256", "src_lang", "tgt_lang", "logdir",
                  "config")


def config_flags(fpath):
    """The flags of --config FILE: another run's hparams.json, or a JSON object of flag values,
    without CONFIG_SKIPPED; each value's type and range checked, naming the file and key. A key that
    is no flag of train.py is a UserError naming it."""
    if os.path.isdir(fpath):
        raise UserError("--config %s is a directory: pass a JSON file of flag values, e.g. a run's "
                        "hparams.json" % fpath)
    if not os.path.isfile(fpath):
        raise UserError("--config %s %s: pass a JSON file of flag values, e.g. a run's "
                        "hparams.json" % (fpath, "is not a regular file" if os.path.exists(fpath)
                                          else "not found"))
    values = read_json(fpath, "fix it, or pass another --config")
    if not isinstance(values, dict):
        raise UserError("--config %s is not a JSON object of flag values ({\"flag\": value, ...})"
                        % fpath)
    flags = {action.dest for action in Hparams().parser._actions if action.dest != "help"}
    for key in values:
        if key not in flags and key not in CONFIG_SKIPPED:
            raise UserError("--config %s: unknown key \"%s\", not a flag of train.py: remove it "
                            "(train.py --help lists the flags)" % (fpath, key))
    problem = type_error(values, fpath) or range_error(Namespace(**values), values,
                                                                     where=fpath)
    if problem:
        raise UserError(problem)
    return {key: value for key, value in values.items() if key not in CONFIG_SKIPPED}


def with_config(given, fpath):
    """The flags given on the command line on top of those of --config FILE: the command line wins,
    and one line on standard error names the config's keys it overrides."""
    config = config_flags(fpath)
    overridden = [key for key in config if key in given and given[key] != config[key]]
    if overridden:
        print("note: the command line overrides --config %s for %s" % (
            fpath, ", ".join("--" + key for key in overridden)), file=sys.stderr)
    return {**config, **given}


def init_source(path):
    """(hyperparameters, checkpoint) of --init_from PATH: a logdir and its latest checkpoint, or a
    checkpoint (best: the best by dev BLEU) and the logdir it is in; a checkpoint that can not be
    read is refused here, before the new run writes anything."""
    logdir = path if os.path.isdir(path) else os.path.dirname(path) or "."
    if not os.path.exists(os.path.join(logdir, HPARAMS_NAME)):
        raise UserError("--init_from %s is neither a logdir written by train.py nor a checkpoint "
                        "in one (no %s in %s)" % (path, HPARAMS_NAME, logdir))
    source = load_trained_hparams(logdir, {})
    ckpt = find_checkpoint(logdir, "" if os.path.isdir(path) else path)
    check_readable(ckpt, "pass another --init_from")
    check_trained(ckpt, logdir)
    return source, ckpt


def check_resume_init(logdir, given):
    """A logdir that holds a run resumes from its own checkpoints: --init_from another run there
    is refused, since hparams.json would record weights that the run never starts from."""
    init_from, recorded = given.get("init_from"), saved_hparams(logdir).get("init_from") or ""
    if init_from and not (init_from == recorded or same_file(init_from, recorded)):
        raise UserError("--logdir %s already holds a run, which resumes from its own checkpoints, "
                        "not from --init_from %s: pass a new --logdir to fine-tune from it, or "
                        "leave out --init_from to resume" % (logdir, init_from))


def init_model_flags(given, source):
    """The model-shape flags (hparams.MODEL_FLAGS but the vocabulary's size, which comes from the
    data dir) of the --init_from run `source`; a flag given with another value is
    a UserError naming it."""
    shape = {flag: getattr(source, flag) for flag in MODEL_FLAGS if flag != "vocab_size"}
    for flag, value in shape.items():
        if flag in given and given[flag] != value:
            raise UserError("--init_from %s holds a model with --%s %s but this run asks for %s: "
                            "leave --%s out (it defaults to that model's) or train without "
                            "--init_from" % (given["init_from"], flag, value, given[flag], flag))
    return shape


def check_init_vocab(hp, source):
    """The data dir (its fingerprint recorded in hp) must have the vocabulary that the --init_from
    run `source` was trained with, where its hparams.json records it."""
    for key, what in (("vocab_size", "vocabulary size"),
                      ("vocab_sha256", "BPE vocabulary (bpe.vocab)"),
                      ("bpe_sha256", "sentencepiece model (bpe.model)")):
        theirs, ours = getattr(source, key, None), getattr(hp, key)
        if theirs is not None and theirs != ours:
            raise UserError("--init_from %s was trained with another %s than --data_dir %s has (%s "
                            "there, %s here): build the data dir with `python prepro.py "
                            "--bpe_model %s ...` to use that model's vocabulary"
                            % (hp.init_from, what, hp.data_dir, str(theirs)[:12], str(ours)[:12],
                                            os.path.join(source.data_dir, BPE_MODEL)))
