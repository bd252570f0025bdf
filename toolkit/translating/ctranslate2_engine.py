"""Our Transformer as a CTranslate2 model: conversion of the weights, and translation with
the CTranslate2 runtime.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is an inference engine for Transformer models
with int8 weights on CPU. It is optional: this module imports it only inside the functions
that need it.

A converted model directory holds CTranslate2's files (model.bin, config.json, the vocabularies),
the data dir's sentencepiece model as bpe.model, and SETTINGS_FILE: the source length limit the
model was trained with, the decoding settings fixed at export and the sha256 of bpe.model, which
translate.py --engine ctranslate2 and serve.py read and check.

How our variables map to CTranslate2's TransformerSpec (its linear weights are (out, in),
our kernels (in, out)):
  shared_weight_matrix/weight_mat, row 0 zeroed  -> encoder and decoder embeddings and the
                                                 decoder's projection
  .../multihead_attention, .../self_attention    -> self_attention.linear[0] = [q; k; v] fused,
                                                 linear[1] = o
  .../vanilla_attention                          -> attention.linear[0] = q, linear[1] = [k; v]
                                                 fused, linear[2] = o
  .../ln (of each sublayer)                      -> the sublayer's layer_norm (on its input when
                                                 pre-norm, on x + f when post-norm:
                                                 CTranslate2's pre_norm flag)
  .../positionwise_feedforward/{inner,outer}     -> ffn.linear_0, ffn.linear_1
  {encoder,decoder}/final_ln (pre-norm only)     -> encoder.layer_norm, decoder.layer_norm
The sinusoidal positions are written out as a table (CTranslate2's own sinusoids put all sines
before all cosines; ours interleave them, modules.positional_encoding).
"""
import argparse
import json
import os
import shutil

import numpy as np

from decoding import Translation
from hparams import DECODING_OPTIONS, check_ranges, range_error
from toolkit.base.errors import UserError
from toolkit.base.reading import check_types, read_json, sha256_file
from toolkit.base.writing import write_json

#: The settings file of a converted model directory.
SETTINGS_FILE = "translate.json"
#: The sentencepiece model's name in a converted model directory.
BPE_MODEL = "bpe.model"
#: Rows of the position table: the longest source or translation the converted model handles.
MAX_POSITIONS = 1024
#: Layer normalization epsilon of modules.ln.
LN_EPSILON = 1e-6
#: The types of SETTINGS_FILE's values: the decoding settings and the source length limit, and what
#: export.py records besides (the checkpoint, the weights' type, the data dir's languages and the
#: sha256 of BPE_MODEL).
SETTINGS_TYPES = {"beam_size": int, "alpha": (float, int), "max_len_a": (float, int),
                  "max_len_b": int, "maxlen1": int, "quantization": str, "checkpoint": str,
                  "src_lang": str, "tgt_lang": str, "bpe_sha256": str}
#: The keys of SETTINGS_FILE that every export has written.
REQUIRED_SETTINGS = ("beam_size", "alpha", "max_len_a", "max_len_b", "maxlen1")
#: What to do about a damaged model directory.
EXPORT_AGAIN = "export the model again with export.py --format ctranslate2"


def checkpoint_weights(ckpt):
    """{variable name: numpy array} of every variable in the checkpoint ckpt (a path prefix)."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(ckpt)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def sinusoid_table(length, d_model):
    """modules.positional_encoding in numpy: (length, d_model), sin on even
    and cos on odd channels."""
    positions = np.arange(length)[:, None]  # (length, 1)
    # (length, d_model)
    angles = positions * np.power(10000.0, -2.0 * (np.arange(d_model) // 2) / d_model)
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def _linear(spec, weights, *scopes):
    """Sets a LinearSpec from the dense layers `scopes`
    (fused along the outputs when there are several)."""
    spec.weight = np.concatenate([weights[scope + "/kernel"].T for scope in scopes])  # (out, in)
    spec.bias = np.concatenate([weights[scope + "/bias"] for scope in scopes])


def _layer_norm(spec, weights, scope):
    spec.gamma, spec.beta = weights[scope + "/gamma"], weights[scope + "/beta"]


def _self_attention(spec, weights, scope):
    _linear(spec.linear[0], weights, scope + "/q", scope + "/k", scope + "/v")
    _linear(spec.linear[1], weights, scope + "/o")
    _layer_norm(spec.layer_norm, weights, scope + "/ln")


def _cross_attention(spec, weights, scope):
    _linear(spec.linear[0], weights, scope + "/q")
    _linear(spec.linear[1], weights, scope + "/k", scope + "/v")
    _linear(spec.linear[2], weights, scope + "/o")
    _layer_norm(spec.layer_norm, weights, scope + "/ln")


def _feed_forward(spec, weights, scope):
    _linear(spec.linear_0, weights, scope + "/inner")
    _linear(spec.linear_1, weights, scope + "/outer")
    _layer_norm(spec.layer_norm, weights, scope + "/ln")


def transformer_spec(weights, hp, pieces):
    """A ctranslate2.specs.TransformerSpec with our weights.

    weights: {variable name: array} (checkpoint_weights). hp: the model's hparams (num_blocks,
    num_heads, norm_type, d_model). pieces: the V vocabulary pieces, in id order (source and target
    share them).
    """
    from ctranslate2 import specs
    pre_norm = hp.norm_type == "pre"
    spec = specs.TransformerSpec.from_config(hp.num_blocks, hp.num_heads, pre_norm=pre_norm)
    spec.config.layer_norm_epsilon = LN_EPSILON
    embeddings = weights["shared_weight_matrix/weight_mat"].copy()  # (V, d_model)
    embeddings[0] = 0.0  # <pad>'s row is a constant zero (modules.get_token_embeddings)
    positions = sinusoid_table(MAX_POSITIONS, hp.d_model)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings
    spec.encoder.position_encodings.encodings = positions
    spec.decoder.position_encodings.encodings = positions
    for i, layer in enumerate(spec.encoder.layer):
        block = "encoder/num_blocks_%d/" % i
        _self_attention(layer.self_attention, weights, block + "multihead_attention")
        _feed_forward(layer.ffn, weights, block + "positionwise_feedforward")
    for i, layer in enumerate(spec.decoder.layer):
        block = "decoder/num_blocks_%d/" % i
        _self_attention(layer.self_attention, weights, block + "self_attention")
        _cross_attention(layer.attention, weights, block + "vanilla_attention")
        _feed_forward(layer.ffn, weights, block + "positionwise_feedforward")
    if pre_norm:
        _layer_norm(spec.encoder.layer_norm, weights, "encoder/final_ln")
        _layer_norm(spec.decoder.layer_norm, weights, "decoder/final_ln")
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def write_model(weights, hp, bpe_model, model_dir, quantization="float32", settings=None):
    """Writes a CTranslate2 model directory: the converted weights (quantized to int8, int16 or
    float32), bpe_model copied as BPE_MODEL, and `settings` (a dict) with the sha256 of bpe_model
    (bpe_sha256) as SETTINGS_FILE. model_dir must not exist."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=bpe_model)
    if sp.get_piece_size() != hp.vocab_size:
        raise ValueError("%s has %d pieces, the model %d"
                         % (bpe_model, sp.get_piece_size(), hp.vocab_size))
    spec = transformer_spec(weights, hp, [sp.id_to_piece(i) for i in range(hp.vocab_size)])
    spec.validate()
    spec.optimize(quantization=quantization)
    os.makedirs(model_dir)
    spec.save(model_dir)
    shutil.copyfile(bpe_model, os.path.join(model_dir, BPE_MODEL))
    write_json(os.path.join(model_dir, SETTINGS_FILE),
               {**(settings or {}), "bpe_sha256": sha256_file(bpe_model)})


#: The decoding flags a CTranslate2 model directory takes on top of its settings: the
#: search's, --seed, and the options of hparams.DECODING_OPTIONS but --ensemble (a model
#: directory holds one model).
DECODING_FLAGS = ("beam_size", "alpha", "max_len_a", "max_len_b", "seed") + tuple(
    flag for flag in DECODING_OPTIONS if flag != "ensemble")


def exported_hparams(model_dir, given, test_batch_size, threads):
    """The settings of model_dir (written by export.py --format ctranslate2) as hparams, with the
    decoding flags given (a dict; DECODING_FLAGS) on top, checked before any model is loaded; a
    UserError when model_dir is not given or not one, or its SETTINGS_FILE or BPE_MODEL is damaged,
    or --ensemble is given."""
    if not model_dir:
        raise UserError("--engine ctranslate2 needs --model DIR, a directory written by export.py "
                        "--format ctranslate2")
    if given.get("ensemble"):
        raise UserError("--ensemble needs --engine tensorflow: a CTranslate2 model directory holds "
                        "one model (pass --logdir and the ensemble's logdirs or checkpoints)")
    try:
        settings = read_settings(model_dir)
    except OSError:
        raise UserError("--model %s is not a directory written by export.py --format ctranslate2 "
                        "(no readable %s)" % (model_dir, SETTINGS_FILE)) from None
    check_bpe_model(model_dir, settings)
    decoding = {flag: given[flag] for flag in DECODING_FLAGS if flag in given}
    hp = argparse.Namespace(**{**settings, "test_batch_size": test_batch_size, "threads": threads,
                               **decoding})
    check_ranges(hp, DECODING_FLAGS + ("test_batch_size", "threads"))
    return hp


def read_settings(model_dir):
    """The SETTINGS_FILE dict of a converted model directory, read and checked as every JSON file
    of the toolkit is (a FIFO, a key given twice, a byte-order mark: reading.read_json; the types
    of its values; the ranges of the flags it holds): a hand edit is a UserError naming the file
    and the key. OSError when there is no file to read."""
    fpath = os.path.join(model_dir, SETTINGS_FILE)
    if not os.path.lexists(fpath):
        raise FileNotFoundError(fpath)
    settings = read_json(fpath, EXPORT_AGAIN)
    if not isinstance(settings, dict):
        raise UserError("%s is not a settings file of export.py (not a JSON object): %s"
                        % (fpath, EXPORT_AGAIN))
    unknown = sorted(set(settings) - set(SETTINGS_TYPES))
    if unknown:
        raise UserError("%s: %s is not a key export.py writes: %s"
                        % (fpath, json.dumps(unknown[0])[1:-1][:80], EXPORT_AGAIN))
    missing = [key for key in REQUIRED_SETTINGS if key not in settings]
    if missing:
        raise UserError("%s: the key %s is missing: %s" % (fpath, missing[0], EXPORT_AGAIN))
    check_types(settings, SETTINGS_TYPES, fpath, EXPORT_AGAIN)
    problem = range_error(argparse.Namespace(**settings), settings, where=fpath)
    if problem:
        raise UserError(problem)
    return settings


def check_bpe_model(model_dir, settings):
    """Refuses a model directory whose BPE_MODEL is not the file it was exported with, as the
    sha256 in its settings says (another vocabulary's would segment text into other ids than the
    model's, and translate garbage); one exported before the sha256 was recorded is not compared."""
    path = os.path.join(model_dir, BPE_MODEL)
    if not os.path.isfile(path):  # a FIFO would block the digest
        raise UserError("%s is missing or not a regular file: %s" % (path, EXPORT_AGAIN))
    if settings.get("bpe_sha256") not in (None, sha256_file(path)):
        raise UserError("%s is not the sentencepiece model the model in %s was exported with (%s "
                        "records another sha256): put back the one it was exported with, or %s"
                        % (path, model_dir, os.path.join(model_dir, SETTINGS_FILE),
                           EXPORT_AGAIN))


#: CTranslate2's threads within one batch when --threads is 0. On small machines its own default
#: (4) spends more handing each decoding step between threads than it gains on the small batches
#: that serve.py and a line-by-line translate.py send; a large batch loses little with one thread
#: (the measurements: docs/log/serving-log.md).
ONE_BATCH_THREADS = 1


class CTranslate2Translator:
    """Translates batches of source ids with a converted model, with the interface of
    toolkit.translating.translator.Translator.run, each decoding.DecodingSettings option mapped onto
    CTranslate2's translate_batch (engine_options).

    Each batch is decoded for at most the longest limit of its sentences, max_len_a * source length
    + max_len_b steps (counting </s>), since CTranslate2 takes one limit per batch; translate.py
    batches sources of similar length (data_load.run_in_length_batches), so the limits of a batch
    are close. A minimum length is one per call too, so a batch whose sentences have different
    minima (min_len_a > 0) is decoded in groups of one minimum each. <pad> and <s> are never output,
    as in our decoder.

    Each batch is one translate_batch, as fast as CTranslate2 runs. The model's log p(ids) (</s>
    included), which the confidence reads, is CTranslate2's score times (tokens with </s>) ^ alpha:
    its scores are log p over that length to the alpha, of its distribution renormalized without
    <pad> and <s> (within 0.1% of the model's on Multi30k; a hypothesis cut at the limit lacks the
    </s> that run adds). Under a prefix, whose tokens its score leaves out, and under an option
    that changes the distribution it draws or chooses from, a scoring pass (score_batch, a
    teacher-forced decoder pass, about as long as greedy decoding) gives the model's own. Scores
    are log p / length_penalty(tokens with </s>, alpha), of the distribution its search chose from
    under an option (as decoding.search's), else of the model's; a source's n translations come in
    CTranslate2's order.

    What comes out as ours does (tests/test_ctranslate2.py), on a batch of one limit: greedy
    decoding under every option but sampling (its generator is CTranslate2's own), and beam search
    under alpha 0 with no option, a prefix, n-gram blocking or sampling_topk 1. Under another
    alpha CTranslate2's beam ranks finished hypotheses by log p / length ^ alpha, not by our
    ((5 + length) / 6) ^ alpha, so a beam's best may differ. Under a minimum length beam search
    gives ours but where it reaches the step limit: our last step forces </s>, CTranslate2's ends
    without one.
    """

    def __init__(self, model_dir, settings, batch_size, nbest=1, compute_type="default", threads=0):
        """settings: a decoding.DecodingSettings, the default of run (its seed is the sampling's
        for every run). batch_size: sources per batch (translate.py's batching). threads:
        CTranslate2's threads within a batch; 0 (--threads' default) means ONE_BATCH_THREADS."""
        import ctranslate2
        import sentencepiece as spm
        self.settings, self.nbest, self.batch_size = settings, nbest, batch_size
        self.model_dir = model_dir
        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, BPE_MODEL))
        self.eos_id = self.sp.piece_to_id("</s>")
        # sampling's seed: CTranslate2 seeds each of its threads' generators once, from the seed
        # set when the thread first draws (set later, it changes nothing for them), so the seed
        # is the settings' for the translator's life, whatever the seed of a run's settings
        ctranslate2.set_random_seed(settings.seed)
        self.engine = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                             intra_threads=threads or ONE_BATCH_THREADS)

    def max_steps(self, sources, settings=None):
        """The decoding limit of a batch: the longest of
        ceil(a * source length + b) (decoding.max_decoding_steps)."""
        settings = settings or self.settings
        return max(int(np.ceil(settings.max_len_a * (len(ids) - 1) + settings.max_len_b)) for ids
                   in sources)

    def pieces(self, ids):
        """The pieces of a list of ids."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def decode(self, sources, max_steps=None, min_steps=1, beam_size=None, return_end_token=False,
               nbest=None, **options):
        """CTranslate2's results for sources (lists of ids ending in </s>): max_steps decoder steps
        at most (the last one may only give </s>; default self.max_steps), min_steps at least
        (counting </s>); beam_size default the settings', nbest hypotheses each (default
        self.nbest); options: more arguments of translate_batch (engine_options)."""
        max_steps = max_steps or self.max_steps(sources)
        # CTranslate2 counts the tokens it outputs, </s> among them: its last step is our last
        # step but one (ours may only give </s>, which run adds when a hypothesis lacks it)
        return self.engine.translate_batch(
            [self.pieces(ids) for ids in sources], beam_size=beam_size or self.settings.beam_size,
            num_hypotheses=nbest or self.nbest, length_penalty=self.settings.alpha,
            max_input_length=0, max_decoding_length=max_steps - 1,
            min_decoding_length=min(min_steps, max_steps) - 1,
            suppress_sequences=[["<pad>"], ["<s>"]], return_end_token=return_end_token, **options)

    def run(self, sources, with_attention=False, settings=None, n=None, prefixes=None):
        """Translates a batch of sources (id lists ending in </s>) under settings (a
        decoding.DecodingSettings; None: self.settings), n translations each (None: self.nbest),
        each starting with its prefix (prefixes: None, or per source a list of target ids).
        Returns per source a decoding.Translation: ids (n, T) ending in </s> then 0s, scores (n,),
        no attention (this engine has no attention pass: with_attention is taken for the
        interface), the model's log p(ids) (n,)."""
        settings, n = settings or self.settings, n or self.nbest
        results = [None] * len(sources)
        for minimum, rows in min_length_groups(sources, settings).items():
            batch = [sources[i] for i in rows]
            found = self.translate(batch, settings, n, minimum,
                                   None if prefixes is None else [prefixes[i] for i in rows])
            for i, translation in zip(rows, found):
                results[i] = translation
        return results

    def translate(self, sources, settings, n, min_length, prefixes):
        """run for sources of one minimum length (tokens before </s>)."""
        max_steps = self.max_steps(sources, settings)
        if prefixes is not None:  # room for the prefix and </s>, as in decoding._encode
            max_steps = max([max_steps] + [len(ids) + 1 for ids in prefixes])
        found = self.engine.translate_batch(
            [self.pieces(ids) for ids in sources],
            None if prefixes is None else [self.pieces(ids) or None for ids in prefixes],
            max_input_length=0, max_decoding_length=max_steps - 1,
            min_decoding_length=min(min_length, max_steps - 1),
            suppress_sequences=[["<pad>"], ["<s>"]], return_end_token=True, return_scores=True,
            length_penalty=settings.alpha, **engine_options(settings, n))
        hypotheses = [[self.ids(tokens) for tokens in result.hypotheses] for result in found]
        lead = [0] * len(sources) if prefixes is None else [len(ids) for ids in prefixes]
        # CTranslate2's score is the log p its search chose from, after the prefix, over (tokens
        # with </s>, after the prefix) ^ alpha
        chosen = [[score * (len(ids) - skip) ** settings.alpha for ids, score
                   in zip(found_ids, result.scores)]
                  for found_ids, result, skip in zip(hypotheses, found, lead)]
        log_probs = chosen
        if prefixes is not None or settings.reshapes_distribution() or settings.samples():
            # the model's own: a scoring pass, which also gives the prefix's log p
            log_probs, prefix_log_probs = self.log_probs(sources, hypotheses, lead)
            chosen = log_probs if not settings.reshapes_distribution() else [
                [c + p for c, p in zip(*pair)] for pair in zip(chosen, prefix_log_probs)]
        return [self.ranked(*pair, settings.alpha, n) for pair
                in zip(hypotheses, chosen, log_probs)]

    def ids(self, tokens):
        """The ids of a hypothesis' pieces, ending in </s> (added when the search hit its limit)."""
        ids = [self.sp.piece_to_id(p) for p in tokens]
        return ids if ids and ids[-1] == self.eos_id else ids + [self.eos_id]

    def log_probs(self, sources, hypotheses, lead=None):
        """The model's log p(ids | source) of each hypothesis, </s> included, and that of its first
        lead[i] tokens (its prefix): two lists per source. sources: N id lists; hypotheses: per
        source a list of id lists ending in </s>; lead: per source a count (None: 0)."""
        lead = lead or [0] * len(sources)
        pairs = [(source, ids, skip) for source, found, skip in zip(sources, hypotheses, lead)
                 for ids in found]
        scored = self.engine.score_batch([self.pieces(source) for source, _, _ in pairs],
                                         [self.pieces(ids[:-1]) for _, ids, _ in pairs],
                                         max_input_length=0)
        totals = iter([(float(np.sum(result.log_probs)), float(np.sum(result.log_probs[:skip])))
                       for result, (_, _, skip) in zip(scored, pairs)])
        per_source = [[next(totals) for _ in found] for found in hypotheses]
        return ([[total for total, _ in rows] for rows in per_source],
                [[prefix for _, prefix in rows] for rows in per_source])

    def ranked(self, hypotheses, chosen, log_probs, alpha, n):
        """One source's n best hypotheses, in CTranslate2's order (its beam ranks by log p / length
        ^ alpha, so that the best of n is the best of 1), as a decoding.Translation: scored as
        decoding.search scores them, chosen (the log p of the distribution the search chose from)
        over length_penalty (tokens with </s>); log_probs, the model's."""
        from data_load import pad
        lengths = np.array([len(ids) for ids in hypotheses[:n]], np.float32)
        scores = np.array(chosen[:n], np.float32) / np.power((5.0 + lengths) / 6.0, alpha)
        return Translation(pad(hypotheses[:n])[0], scores, None,
                           np.array(log_probs[:n], np.float32))

    def close(self):
        """Frees the model's memory."""
        del self.engine


def engine_options(settings, n):
    """The arguments of CTranslate2's translate_batch for the search of settings (a
    decoding.DecodingSettings) but the lengths and the length penalty, n translations per source:
    the beam, sampling, n-gram blocking and the repetition penalty (CTranslate2's own definitions,
    which decoding.StepRules follows)."""
    options = {"beam_size": settings.beam_size, "num_hypotheses": n,
               "no_repeat_ngram_size": settings.no_repeat_ngram_size,
               "repetition_penalty": settings.repetition_penalty}
    if settings.samples():  # 0 is the whole vocabulary, as in CTranslate2
        options.update(sampling_topk=settings.sampling_topk,
                       sampling_topp=settings.sampling_topp,
                       sampling_temperature=settings.sampling_temperature)
    return options


def min_length_groups(sources, settings):
    """{minimum: the rows of sources with it}: each sentence's minimum number of tokens before </s>,
    decoding.min_decoding_lengths in numpy. sources: id lists ending in </s>."""
    groups = {}
    for i, ids in enumerate(sources):
        minimum = int(np.ceil(np.float32(settings.min_len_a) * np.float32(len(ids) - 1)
                              + np.float32(settings.min_len_b)))
        groups.setdefault(minimum, []).append(i)
    return groups
