"""The model of translate.py, serve.py and test.py --src, held open: one decoding graph over
placeholders (or, to score, one teacher-forced graph) and a session with the checkpoint restored; or
the CTranslate2 engine of a model exported by export.py --format ctranslate2."""
import dataclasses

import tensorflow as tf

import decoding
from data_load import Sources, pad
from toolkit.translating import ctranslate2_engine
from toolkit.base.errors import UserError
from toolkit.base.ids import PAD_ID

tf1 = tf.compat.v1


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
            # (N, nbest, T), (N, nbest): best first
            self.model, self.xs = model, xs
            self.settings = decoding.DecodingSettings.from_flags(hp)
            self.nbest_ids, self.nbest_scores = decoding.nbest(model, xs, self.settings, nbest)
            self.beams = {None: (self.nbest_ids, self.nbest_scores)}
        if with_attention:
            self.attention = model.attention(xs, self.targets)  # (N, h, T2, T1)
        self.sess = trained.session()

    def run(self, sources, with_attention=True, beam=None):
        """sources: list of N id lists, each ending in </s>. with_attention: run the attention pass
        (a translator built with_attention) for these sources; False skips it. beam: a beam size
        other than the flags' (the beam best translations of each source), its graph built on
        first use over the same weights.

        Returns per source: nbest ids (K, T) ending in </s> then 0s, scores (K,) (a slot beam search
        could not fill scores NEG_INF), and the best translation's attention (h, T2, T1), or None
        without it.
        """
        x, x_seqlen = pad(sources)
        feed = {self.x: x, self.x_seqlen: x_seqlen}
        ids, scores = self.sess.run(self.decoder(beam), feed)
        attention = [None] * len(sources)
        if self.attention is not None and with_attention:
            attention = self.sess.run(self.attention, {**feed, self.targets: ids[:, 0, :]})
        return list(zip(ids, scores, attention))

    def decoder(self, beam):
        """The (ids, scores) tensors of the beam best translations under a beam of that size (of
        the flags' beam and n-best when None)."""
        if beam not in self.beams:
            settings = dataclasses.replace(self.settings, beam_size=beam)
            with self.sess.graph.as_default():  # the default graph is per thread
                self.beams[beam] = decoding.nbest(self.model, self.xs, settings, beam)
        return self.beams[beam]

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
