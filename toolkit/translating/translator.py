"""The model of translate.py, serve.py and test.py --src, held open: one decoding graph over
placeholders (or, to score, one teacher-forced graph) and a session with the checkpoint restored; or
the CTranslate2 engine of a model exported by export.py --format ctranslate2."""
import contextlib
import dataclasses

import numpy as np
import tensorflow as tf

import decoding
from data_load import Sources, pad
from toolkit.translating import ctranslate2_engine
from toolkit.base.errors import UserError
from toolkit.base.ids import PAD_ID

tf1 = tf.compat.v1


def fed_type(option):
    """The dtype of a fed option's placeholder: that of its default (decoding.OPTION_DEFAULTS)."""
    return tf.int32 if isinstance(decoding.OPTION_DEFAULTS[option], int) else tf.float32


def graph_key(settings):
    """What fixes the decoding graph of settings: everything but the numbers of the fed options
    that are on, which stand as "fed"."""
    return dataclasses.replace(settings, **{option: "fed" for option in decoding.FED_OPTIONS
                                            if settings.uses(option)}, min_confidence=0.0)


def pad_prefixes(prefixes):
    """Target prefixes (lists of ids) as one (N, P) int32 array padded with 0, P at least 1."""
    width = max([1] + [len(ids) for ids in prefixes])
    return np.array([list(ids) + [PAD_ID] * (width - len(ids)) for ids in prefixes], np.int32)


class Translator:
    """One decoding graph over placeholders (or, scoring, one teacher-forced graph), and a session
    with the checkpoint restored."""

    def __init__(self, trained, nbest=1, with_attention=False, scoring=False):
        """trained: a trained_model.TrainedModel. nbest: translations per source; with_attention:
        also the graph of the best translation's cross-attention; scoring: the teacher-forced graph
        of score() instead."""
        hp = trained.hp
        self.batch_size = hp.test_batch_size
        # (N, T1) source ids + </s>, padded with 0
        self.x = tf1.placeholder(tf.int32, [None, None], name="x")
        self.x_seqlen = tf1.placeholder(tf.int32, [None], name="x_seqlen")  # (N,)
        # (N, T2) ids ending in </s>
        self.targets = tf1.placeholder(tf.int32, [None, None], name="targets")
        xs = Sources(self.x, self.x_seqlen)
        model = trained.build()
        self.attention = None
        if scoring:
            log_probs = model.score(xs, self.targets, alpha=0.0)  # (N,): a penalty of 1
            # with </s>
            lengths = tf.reduce_sum(tf.cast(tf.not_equal(self.targets, PAD_ID), tf.int32), axis=1)
            self.forced_scores = log_probs, log_probs / decoding.length_penalty(lengths, hp.alpha)
        else:
            self.model, self.xs = model, xs
            self.settings = decoding.DecodingSettings.from_flags(hp)
            self.nbest = nbest
            # (settings' graph_key, n, with a prefix) -> (outputs, {option: placeholder}, prefix)
            self.graphs = {}
            self.decoder(self.settings, nbest, False)  # the flags' graph, built now
        if with_attention:
            self.attention = model.attention(xs, self.targets)  # (N, h, T2, T1)
        self.sess = trained.session()

    def run(self, sources, with_attention=True, settings=None, n=None, prefixes=None):
        """sources: list of N id lists, each ending in </s>. with_attention: run the attention pass
        (a translator built with_attention) for these sources; False skips it. settings: a
        decoding.DecodingSettings other than the flags' and n the translations it returns per
        source (None: the flags' and nbest); its graph is built on first use over the same
        weights, and requests that differ only in the numbers of decoding.FED_OPTIONS share it.
        prefixes: None, or per source the target ids its translations start with.

        Returns per source a decoding.Translation: ids (n, T) ending in </s> then 0s, scores (n,)
        (a slot beam search could not fill scores NEG_INF), the best translation's attention (h,
        T2, T1) or None without it, and the model's log-probabilities (n,).
        """
        settings = settings or self.settings
        (ids_op, scores_op, log_probs_op), options, prefix = self.decoder(
            settings, n or self.nbest, prefixes is not None)
        x, x_seqlen = pad(sources)
        feed = {self.x: x, self.x_seqlen: x_seqlen}
        outputs = self.sess.run((ids_op, scores_op, log_probs_op), {
            **feed, **{placeholder: getattr(settings, option) for option, placeholder
                       in options.items()},
            **({prefix: pad_prefixes(prefixes)} if prefixes is not None else {})})
        ids = outputs[0]
        attention = [None] * len(sources)
        if self.attention is not None and with_attention:
            attention = self.sess.run(self.attention, {**feed, self.targets: ids[:, 0, :]})
        return [decoding.Translation(*row) for row in zip(ids, outputs[1], attention, outputs[2])]

    def decoder(self, settings, n, with_prefix):
        """The (ids, scores, log_probs) tensors of the n best translations under settings, the
        placeholders of its fed options and of the prefixes (None without), built on first use."""
        key = (graph_key(settings), n, with_prefix)
        if key not in self.graphs:
            with self.model_graph():
                fed = {option: tf1.placeholder_with_default(
                    tf.constant(getattr(settings, option), fed_type(option)), [], name=option)
                    for option in decoding.FED_OPTIONS if settings.uses(option)}
                # (N, P) target prefixes padded with 0
                prefix = tf1.placeholder(tf.int32, [None, None], "prefix") if with_prefix \
                    else None
                outputs = decoding.search(self.model, self.xs,
                                          dataclasses.replace(settings, **fed), n, prefix)
            self.graphs[key] = outputs, fed, prefix
        return self.graphs[key]

    def model_graph(self):
        """The translator's graph as the default one: the default graph is per thread, and serve.py
        builds graphs in its worker thread."""
        sess = getattr(self, "sess", None)
        return sess.graph.as_default() if sess else contextlib.nullcontext()

    def score(self, sources, targets):
        """sources, targets: lists of N id lists, each ending in </s>. Returns per pair
        (log p(target | source), log p / length penalty), in batches of batch_size pairs
        taken in order."""
        scores = []
        for start in range(0, len(sources), self.batch_size):
            (x, x_seqlen), (y, _) = (pad(ids[start:start + self.batch_size]) for ids
                                     in (sources, targets))
            batch = self.sess.run(self.forced_scores,
                                  {self.x: x, self.x_seqlen: x_seqlen, self.targets: y})
            scores.extend(zip(*batch))
        return scores

    def close(self):
        self.sess.close()


def ctranslate2_translator(model_dir, hp, nbest):
    """A CTranslate2Translator for --model DIR; a UserError when ctranslate2 is missing."""
    try:
        return ctranslate2_engine.CTranslate2Translator(model_dir,
                                                        decoding.DecodingSettings.from_flags(hp),
                                                        hp.test_batch_size, nbest,
                                                        threads=hp.threads)
    except ImportError:
        raise UserError("--engine ctranslate2 needs the ctranslate2 package: pip install -r "
                        "requirements.txt") \
            from None
    except RuntimeError as error:
        raise UserError("cannot load the CTranslate2 model in %s: %s"
                        % (model_dir, error)) from None
