"""A trained model, loaded one way by every tool that decodes with it (test.py, translate.py,
export.py, serve.py, plot_attention.py through translate.py,
scripts/bench_decode.py and bench_serve.py):

    hp = trained_hparams(logdir, given)           # LOGDIR/hparams.json, the decoding flags
                                                  # given on top
    trained = TrainedModel(hp, ckpt, ("test",))   # the data dir and the checkpoint
                                                  # (--ckpt), checked
    ids, scores = trained.translation(xs)         # the decoding graph of the decoding flags
    sess = trained.session()                      # a session with the checkpoint restored

The precision (--precision auto) is resolved once, in trained_hparams, for the implementation
(--impl) the model is built in; the model's shape and data dir come from hparams.json.
"""
import os

import sentencepiece as spm
import tensorflow as tf

from decoding import DecodingSettings, translate
from hparams import DECODING_FLAGS, resolved
from model import ModelConfig
from toolkit.base import machine
from toolkit.base.errors import UserError
from toolkit.base.writing import same_file
from toolkit.data.datadir import bpe_model_path
from fast import build_transformer
from toolkit.training.logdir import (find_checkpoint, load_trained_hparams, restore,
                                     trained_model_files)

tf1 = tf.compat.v1


def trained_hparams(logdir, overrides, **values):
    """LOGDIR/hparams.json with `overrides` (the flags given, a dict) and values (a tool's own)
    on top, the precision resolved for this machine and --impl (machine.resolved_precision);
    read-only (hparams.resolved)."""
    hp = load_trained_hparams(logdir, overrides)
    return resolved(hp, precision=machine.resolved_precision(hp.impl, hp.precision), **values)


def read_dirs(hp, ckpt=None):
    """{what: directory} of the directories a tool decoding with hp reads: its logdir, its data dir
    and the directory of the checkpoint it restores (ckpt, default hp.ckpt: --ckpt may name one in
    another run's logdir). Its outputs may not be these directories nor replace a file in them, the
    checkpoint's .index and .data-* files among them (writing.check_not_an_input and
    check_output_dir, which compare files through links and hard links)."""
    return {"logdir": hp.logdir, "data dir": hp.data_dir,
            "checkpoint's directory": checkpoint_dir(hp, hp.ckpt if ckpt is None else ckpt)}


def checkpoint_dir(hp, ckpt):
    """The directory of the checkpoint a tool restores (find_checkpoint: ckpt, best, or the latest
    of hp.logdir, which the index may list elsewhere); None when it is hp.logdir itself, or when
    there is none (TrainedModel reports that, after the checks of the outputs)."""
    try:
        directory = os.path.dirname(find_checkpoint(hp.logdir, ckpt))
    except UserError:
        return None
    return None if same_file(directory, hp.logdir) else directory


def decoding_flags(given):
    """The decoding flags (hparams.DECODING_FLAGS) among `given`, parse_flags' dict of the flags
    given: those that override hparams.json in translate.py and serve.py."""
    return {flag: value for flag, value in given.items() if flag in DECODING_FLAGS}


class TrainedModel:
    """The model trained in hp.logdir: its data dir's manifest and sentencepiece model, and the
    checkpoint to restore (ckpt, --ckpt: a path, best, or "" for the latest), checked before any
    graph is built."""

    def __init__(self, hp, ckpt="", splits=()):
        """splits: the data dir's splits the tool reads, whose files are checked too."""
        self.hp, self.ckpt_given = hp, ckpt
        self.manifest, self.ckpt = trained_model_files(hp, ckpt, splits)
        self.bpe_model = bpe_model_path(hp.data_dir, self.manifest)

    def sentencepiece(self):
        """The data dir's sentencepiece model, which segments the model's text."""
        return spm.SentencePieceProcessor(model_file=self.bpe_model)

    def build(self):
        """The model (model.Transformer, or fast's of --impl fast) in the default graph."""
        return build_transformer(ModelConfig.from_flags(self.hp))

    def translation(self, xs):
        """The decoding graph: greedy or beam search (decoding.translate) over xs, a
        data_load.Sources, as the decoding flags say. Returns ids (N, T') ending in </s> then 0s,
        and scores (N,)."""
        return translate(self.build(), xs, DecodingSettings.from_flags(self.hp))

    def session(self):
        """A session of the default graph with --threads thread pools and the checkpoint restored
        into its variables. self.ckpt becomes the checkpoint restored: when training deleted the
        latest one meanwhile, the newest then (not when --ckpt named one)."""
        # TensorFlow's start-up code, run once: out of the resident set
        machine.release_library_pages()
        sess = tf1.Session(config=machine.session_config(self.hp))
        try:
            self.ckpt = restore(sess, self.ckpt, self.hp.logdir, follow_latest=not self.ckpt_given)
        except BaseException:
            sess.close()
            raise
        return sess
