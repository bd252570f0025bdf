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
(--impl) the model is built in; the model's shape and data dir come from hparams.json. With
--ensemble, build() returns a decoding.Ensemble of that model and the members', each member in a
variable scope of its own (ensemble_1, ensemble_2, ...) and restored from its own checkpoint.
"""
import collections
import os

import sentencepiece as spm
import tensorflow as tf

from decoding import DecodingSettings, Ensemble, translate
from hparams import DECODING_FLAGS, resolved
from model import ModelConfig, Transformer
from toolkit.base import machine
from toolkit.base.errors import UserError
from toolkit.base.writing import same_file
from toolkit.data.datadir import bpe_model_path, fingerprint
from fast import build_transformer
from toolkit.training.logdir import (check_not_rejected, check_trained, find_checkpoint,
                                     load_trained_hparams, restore, trained_model_files)

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
    dirs = {"logdir": hp.logdir, "data dir": hp.data_dir,
            "checkpoint's directory": checkpoint_dir(hp, hp.ckpt if ckpt is None else ckpt)}
    for number, given in enumerate(getattr(hp, "ensemble", None) or (), 1):
        dirs["--ensemble model %d's logdir" % number] = member_paths(given)[0]
    return dirs


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


#: The variable scope of the n-th member of an ensemble (--ensemble), n from 1; the model of
#: --logdir is built at the graph's root.
MEMBER_SCOPE = "ensemble_%d"

#: A model of --ensemble: the path given, its logdir, its checkpoint, its hparams (those of
#: hparams.json with the main model's --impl, precision and kernels) and its variable scope.
Member = collections.namedtuple("Member", "given logdir ckpt hp scope")


def member_paths(given):
    """The logdir and checkpoint ("": its latest) of an --ensemble path: a logdir, or a checkpoint
    (its path prefix, one of its files, or LOGDIR/best) in a logdir."""
    if os.path.isdir(given):
        return given, ""
    return os.path.dirname(given) or ".", given


def ensemble_members(hp, manifest):
    """The models of hp.ensemble, checked before any graph is built: each a logdir with a trained
    checkpoint and the vocabulary of hp's model (that of its data dir, manifest). A list of
    Member."""
    given = getattr(hp, "ensemble", None) or ()
    vocabulary = fingerprint(hp.data_dir, manifest) if given else None
    return [ensemble_member(path, MEMBER_SCOPE % number, hp, vocabulary)
            for number, path in enumerate(given, 1)]


def ensemble_member(given, scope, hp, vocabulary):
    """The Member of --ensemble path `given`, built in variable scope `scope`; hp: the main model's
    hparams, vocabulary: its data dir's fingerprint (datadir.fingerprint). Any problem is a
    UserError naming the member."""
    logdir, ckpt = member_paths(given)
    try:
        if not os.path.isdir(logdir):
            raise UserError("no such logdir or checkpoint")
        check_not_rejected(logdir)
        member_hp = load_trained_hparams(logdir, {"impl": hp.impl, "precision": hp.precision,
                                                  "kernels": hp.kernels})
        check_member_vocab(member_hp, hp, vocabulary)
        ckpt = find_checkpoint(logdir, ckpt)
        check_trained(ckpt, logdir)
    except UserError as error:
        raise UserError("--ensemble %s: %s" % (given, error)) from None
    return Member(given, logdir, ckpt, member_hp, scope)


def check_member_vocab(member_hp, hp, vocabulary):
    """A member reads the main model's ids: the sentencepiece model, BPE vocabulary and size that
    its hparams.json records (older ones lack the hashes, hparams.LEGACY_VALUES: not compared),
    and its direction, are those of the main model's data dir (vocabulary: its fingerprint)."""
    for key, what in (("bpe_sha256", "sentencepiece model (bpe.model)"),
                      ("vocab_sha256", "BPE vocabulary (bpe.vocab)"),
                      ("vocab_size", "vocabulary size (%d)" % member_hp.vocab_size)):
        if getattr(member_hp, key, None) not in (None, vocabulary[key]):
            raise UserError("it was trained with another %s than the model in %s (that of %s): "
                            "the models of an ensemble share one vocabulary; leave it out, or "
                            "pass models trained on data dirs with the same bpe.model"
                            % (what, hp.logdir, hp.data_dir))
    direction = (getattr(member_hp, "src_lang", None), getattr(member_hp, "tgt_lang", None))
    main = (vocabulary["src_lang"], vocabulary["tgt_lang"])
    if None not in direction and direction != main:
        raise UserError("it translates %s->%s but the model in %s translates %s->%s: leave it out"
                        % (*direction, hp.logdir, *main))


class TrainedEnsemble(Ensemble):
    """decoding.Ensemble with the teacher-forced graphs of a model, for translate.py --score and
    the attention of serve.py and --plot_attention: the members' log-probabilities averaged at each
    position, and the main model's cross-attention."""

    def teacher_forced(self, xs, ids):
        """ids: (N, T) ending in </s> then 0s. Returns the mean of the models' log-probabilities
        (N, T, V), logits that Transformer.score renormalizes (decoding_log_probs), and the main
        model's last cross-attention (N, h, T, T1)."""
        log_probs, attention = [], None
        for i, model in enumerate(self.models):
            with self._in_scope(i):
                logits, model_attention = model.teacher_forced(xs, ids)
            log_probs.append(tf.nn.log_softmax(tf.cast(logits, tf.float32)))
            attention = model_attention if attention is None else attention
        return tf.add_n(log_probs) / len(log_probs), attention

    # log p(ids | x) of the renormalized mean, token by token; the main model's attention
    score, attention = Transformer.score, Transformer.attention


class TrainedModel:
    """The model trained in hp.logdir: its data dir's manifest and sentencepiece model, and the
    checkpoint to restore (ckpt, --ckpt: a path, best, or "" for the latest), checked before any
    graph is built."""

    def __init__(self, hp, ckpt="", splits=()):
        """splits: the data dir's splits the tool reads, whose files are checked too."""
        self.hp, self.ckpt_given = hp, ckpt
        self.manifest, self.ckpt = trained_model_files(hp, ckpt, splits)
        self.bpe_model = bpe_model_path(hp.data_dir, self.manifest)
        self.members = ensemble_members(hp, self.manifest)  # --ensemble

    def sentencepiece(self):
        """The data dir's sentencepiece model, which segments the model's text."""
        return spm.SentencePieceProcessor(model_file=self.bpe_model)

    def build(self):
        """The model (model.Transformer, or fast's of --impl fast) in the default graph; with
        --ensemble, a TrainedEnsemble of it (at the graph's root) and the members (each in its
        variable scope)."""
        model = build_transformer(ModelConfig.from_flags(self.hp))
        if not self.members:
            return model
        models = [model]
        for member in self.members:
            with tf1.variable_scope(member.scope, reuse=tf1.AUTO_REUSE):
                models.append(build_transformer(ModelConfig.from_flags(member.hp)))
        return TrainedEnsemble(models, [None] + [member.scope for member in self.members])

    def translation(self, xs):
        """The decoding graph: greedy or beam search (decoding.translate) over xs, a
        data_load.Sources, as the decoding flags say. Returns ids (N, T') ending in </s> then 0s,
        and scores (N,)."""
        return translate(self.build(), xs, DecodingSettings.from_flags(self.hp))

    def session(self):
        """A session of the default graph with --threads thread pools and the checkpoint restored
        into its variables, and each --ensemble member's into those of its scope. self.ckpt (and
        each member's ckpt) becomes the checkpoint restored: when training deleted the latest one
        meanwhile, the newest then (not when --ckpt, or the member's path, named one)."""
        # TensorFlow's start-up code, run once: out of the resident set
        machine.release_library_pages()
        sess = tf1.Session(config=machine.session_config(self.hp))
        try:
            self.ckpt = restore(sess, self.ckpt, self.hp.logdir, follow_latest=not self.ckpt_given,
                                variables=self.main_variables())
            self.members = [member._replace(ckpt=restore(
                sess, member.ckpt, member.logdir, follow_latest=not member_paths(member.given)[1],
                variables=member_variables(member.scope))) for member in self.members]
        except BaseException:
            sess.close()
            raise
        return sess

    def main_variables(self):
        """The variables of the main model (None: every variable of the graph, without
        --ensemble): those outside the members' scopes."""
        if not self.members:
            return None
        scopes = tuple(member.scope + "/" for member in self.members)
        return [v for v in tf1.global_variables() if not v.op.name.startswith(scopes)]


def member_variables(scope):
    """{name in the member's checkpoint: variable} of the variables built in scope."""
    return {v.op.name[len(scope) + 1:]: v for v in tf1.global_variables()
            if v.op.name.startswith(scope + "/")}
