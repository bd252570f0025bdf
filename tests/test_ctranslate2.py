"""ctranslate2_engine.py: our weights converted to CTranslate2 decode as our own decoder does
(post- and pre-norm, several blocks and heads), int8 export shrinks the model, and the engine
translates as the TensorFlow one does under each decoding option, or where it cannot, as close as
CTranslate2 allows. Skipped when ctranslate2 is not installed."""
import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from toolkit.translating import ctranslate2_engine
from decoding import DecodingSettings, translate
from model_fixtures import build, random_ids, small_hp
from toolkit.base.errors import UserError
from toolkit.base.ids import EOS_ID
from toolkit.base.writing import write_json
from toolkit.translating.trained_model import TrainedModel, trained_hparams
from toolkit.translating.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2")
tf1 = tf.compat.v1
STEPS = 12  # decoding steps per sentence, the last of which may only give </s>
#: The lengths (with </s>) of the sources the engines' options are compared on.
SOURCE_LENGTHS = [9, 2, 5, 7, 3, 8, 6, 4]


def pieces(vocab_size):
    return ["<pad>", "<unk>", "<s>", "</s>"] + ["p%d" % i for i in range(4, vocab_size)]


@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_converted_model_decodes_like_our_cached_greedy(norm_type, tmp_path):
    """Random weights, scaled up so that different sources get different translations."""
    rng = np.random.RandomState(7)
    hp = small_hp(num_blocks=2, norm_type=norm_type)
    with tf.Graph().as_default():
        model, ph = build(hp)
        ids_op, _ = translate(model, ph.xs,
                              DecodingSettings(alpha=0.6, max_len_a=0.0, max_len_b=STEPS))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            variables = tf1.global_variables()
            weights = {v.op.name: 3.0 * value for v, value in zip(variables, sess.run(variables))}
            sess.run([v.assign(weights[v.op.name]) for v in variables])
            x = random_ids(rng, [9, 2, 5, 7, 3, 8, 6, 4], hp.vocab_size)
            ours = [[int(i) for i in row if i] for row in sess.run(ids_op, ph.feed(x))]
    spec = ctranslate2_engine.transformer_spec(weights, hp, pieces(hp.vocab_size))
    spec.validate()
    spec.optimize(quantization="float32")
    spec.save(str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", compute_type="float32")
    sources = [[pieces(hp.vocab_size)[i] for i in row if i] for row in x]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=STEPS - 1,
                                         suppress_sequences=[["<pad>"], ["<s>"]],
                                         return_end_token=True)
    theirs = [[pieces(hp.vocab_size).index(p) for p in r.hypotheses[0]] for r in results]
    # at the limit ours gives </s>
    theirs = [ids if ids[-1] == 3 else ids + [3] for ids in theirs]
    # a comparison that can tell sentences apart
    assert len({tuple(ids) for ids in ours}) >= 4, ours
    assert theirs == ours


def test_int8_export_shrinks_the_model(tmp_path):
    """int8 linear weights; the position table, biases and layer norms stay float32."""
    hp = small_hp(vocab_size=40, d_model=64, d_ff=256)
    with tf.Graph().as_default():
        model, ph = build(hp)
        translate(model, ph.xs, DecodingSettings())  # creates every variable
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            variables = tf1.global_variables()
            weights = {v.op.name: value for v, value in zip(variables, sess.run(variables))}
    sizes = {}
    for quantization in ("float32", "int8"):
        spec = ctranslate2_engine.transformer_spec(weights, hp, pieces(hp.vocab_size))
        spec.validate()
        spec.optimize(quantization=quantization)
        os.makedirs(tmp_path / quantization)
        spec.save(str(tmp_path / quantization))
        sizes[quantization] = os.path.getsize(tmp_path / quantization / "model.bin")
    assert sizes["int8"] < 0.5 * sizes["float32"], sizes


# ------------------------------------------------------------ the options, engine against engine
#: Sources of the tiny model's language (numbers in German), of several lengths.
SENTENCES = ["Er zählt bis elf.", "dreihundertzehn", "zweiundvierzig und sieben",
             "Sie hat neunzehn Bücher.", "vier", "siebenhundert und drei und achtzig Häuser",
             "Wir haben zwölf Katzen und dreizehn Hunde.", "eins zwei drei"]
#: The decoding limit of every sentence (CTranslate2 takes one per batch, ours is per sentence):
#: each can end with its </s> before it.
STEPS_EACH = 40


@pytest.fixture(scope="module")
def engines(tiny_model, tmp_path_factory):
    """(decode, engine, sources) of the session's tiny trained model: decode(settings,
    prefixes=None) runs its TensorFlow Translator (ids (N, n, T), scores (N, n), log p (N, n));
    engine is a CTranslate2Translator of its export (float32); sources: SENTENCES' ids."""
    import export
    logdir, _ = tiny_model
    model_dir = str(tmp_path_factory.mktemp("ct2") / "model")
    assert export.main(["--logdir", logdir, "--export_dir", model_dir, "--format",
                        "ctranslate2"]) == 0
    hp = trained_hparams(logdir, {"precision": "fp32"})  # as the float32 export computes
    trained = TrainedModel(hp, hp.ckpt)
    sp = trained.sentencepiece()
    sources = [sp.encode(text) + [EOS_ID] for text in SENTENCES]
    with tf.Graph().as_default():
        translator = Translator(trained)

    def decode(settings, prefixes=None):
        found = translator.run(sources, False, settings, 1, prefixes)
        return tuple(np.stack([getattr(t, field) for t in found])
                     for field in ("ids", "scores", "log_probs"))
    engine = ctranslate2_engine.CTranslate2Translator(model_dir, DecodingSettings(), 8,
                                                      compute_type="float32")
    yield decode, engine, sources
    translator.close()
    engine.close()


def outputs(ids):
    """Id lists without their padding, of an (N, T) array."""
    return [[int(i) for i in row if i] for row in ids]


def compare(engines, settings, prefixes=None, scores_too=True):
    """The best translation of each source by both engines: the same ids, log p(ids) and (with
    scores_too) scores. Returns them, id lists. Without a prefix or an option that changes the
    distribution, the engine's log p is CTranslate2's score times the length to the alpha, of its
    distribution renormalized without <pad> and <s>: at least the model's; else a scoring
    pass's, the model's."""
    decode, engine, sources = engines
    ids, scores, log_probs = decode(settings, prefixes)
    found = engine.run(sources, settings=settings, n=1, prefixes=prefixes)
    assert [outputs(t.ids)[0] for t in found] == outputs(ids[:, 0]), settings
    engine_log_probs = np.array([t.log_probs[0] for t in found])
    if prefixes is not None or settings.reshapes_distribution():
        # the model's log p; our scores are of the distribution the options left
        np.testing.assert_allclose(engine_log_probs, log_probs[:, 0], rtol=1e-4)
        if scores_too and not settings.reshapes_distribution():
            np.testing.assert_allclose([t.scores[0] for t in found], scores[:, 0], rtol=1e-4)
    else:  # renormalized without <pad> and <s>, which this briefly trained model still likes
        assert np.all(engine_log_probs >= log_probs[:, 0] - 1e-3)
    return outputs(ids[:, 0])


def settings(beam, **options):
    """DecodingSettings of one limit for every source (CTranslate2 takes one per batch); beam
    search under alpha 0, where CTranslate2's ranking (log p / length ^ alpha) is ours
    (log p / ((5 + length) / 6) ^ alpha)."""
    return DecodingSettings(beam_size=beam, alpha=0.6 if beam == 1 else 0.0, max_len_a=0.0,
                            max_len_b=STEPS_EACH, **options)


BEAMS = [1, 4]
#: Per source a target prefix: of several tokens, one, none.
PREFIXES = [[5, 6, 7], [], [9], [4, 4], [30, 31, 32, 33], [8], [], [10, 11]]


@pytest.mark.parametrize("beam", BEAMS)
def test_no_option(engines, beam):
    """Scores too: log p / length_penalty of ours, a beam ranked by it."""
    compare(engines, settings(beam))


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_beam_under_other_length_penalties_is_ctranslate2s_scored_as_ours(engines, alpha):
    """CTranslate2's own beam under its length penalty (log p / length ^ alpha): its best of 4 is
    its best of 1, each translation scored log p / ((5 + length) / 6) ^ alpha, its log p at
    least the model's (renormalized without <pad> and <s>)."""
    _, engine, sources = engines
    beam = dataclasses.replace(settings(4), alpha=alpha)
    found = engine.run(sources, settings=beam, n=4)
    best = engine.run(sources, settings=beam, n=1)
    assert [outputs(t.ids)[0] for t in found] == [outputs(t.ids)[0] for t in best]
    for translation in found:
        lengths = (translation.ids != 0).sum(1)
        np.testing.assert_allclose(translation.scores,
                                   translation.log_probs / ((5 + lengths) / 6) ** alpha, rtol=1e-6)
    exact, _ = engine.log_probs(sources, [[outputs(t.ids)[0]] for t in found])
    assert np.all(np.array([t.log_probs[0] for t in found]) >= np.ravel(exact) - 1e-3)


@pytest.mark.parametrize("beam", BEAMS)
def test_prefix(engines, beam):
    """The prefix is output, and counted as ours counts it (in the limit and the scores)."""
    got = compare(engines, settings(beam), PREFIXES)
    assert all(ids[:len(prefix)] == prefix for ids, prefix in zip(got, PREFIXES))
    assert got != compare(engines, settings(beam))


#: Minimum lengths (min_len_a, min_len_b): one for every sentence, and one of each.
MINIMA = [(0.0, 6), (1.0, 2), (0.5, 1)]


@pytest.mark.parametrize("a, b", MINIMA)
def test_min_length_greedy(engines, a, b):
    """Each sentence its own minimum (min_len_a > 0: the batch is decoded in groups), counted
    alike; with a prefix, which counts towards it in both engines."""
    _, _, sources = engines
    got = compare(engines, settings(1, min_len_a=a, min_len_b=b))
    minima = [int(np.ceil(a * (len(source) - 1) + b)) for source in sources]
    assert all(len(ids) - 1 >= minimum for ids, minimum in zip(got, minima))
    assert got != compare(engines, settings(1))
    compare(engines, settings(1, min_len_a=a, min_len_b=b), PREFIXES)


@pytest.mark.parametrize("a, b", MINIMA)
def test_min_length_beam(engines, a, b):
    """Both engines choose from the distribution renormalized over the tokens the minimum leaves:
    the same translations, but where the search reaches the step limit (a minimum can push this
    briefly trained model into a loop), at which our last step forces </s> while CTranslate2's
    ends without one. Each of its translations obeys the minimum, its log p the model's."""
    decode, engine, sources = engines
    beam = settings(4, min_len_a=a, min_len_b=b)
    ids, _, _ = decode(beam)
    found = engine.run(sources, settings=beam, n=1)
    got, ours = [outputs(t.ids)[0] for t in found], outputs(ids[:, 0])
    minima = [int(np.ceil(a * (len(source) - 1) + b)) for source in sources]
    assert all(len(ids) - 1 >= minimum for ids, minimum in zip(got, minima))
    exact, _ = engine.log_probs(sources, [[ids] for ids in got])
    np.testing.assert_allclose([t.log_probs[0] for t in found], np.ravel(exact), rtol=1e-5)
    ended = [i for i in range(len(sources)) if max(len(got[i]), len(ours[i])) < STEPS_EACH]
    assert len(ended) >= len(sources) - 2 and [got[i] for i in ended] == [ours[i] for i in ended]


def repeats(ids, size):
    """Whether a list of ids holds an n-gram of `size` tokens twice."""
    ngrams = [tuple(ids[i:i + size]) for i in range(len(ids) - size + 1)]
    return len(set(ngrams)) < len(ngrams)


@pytest.mark.parametrize("size", [1, 2])
def test_no_repeat_ngram_greedy(engines, size):
    """The prefix's tokens count as output in both engines."""
    got = compare(engines, settings(1, no_repeat_ngram_size=size))
    assert not any(repeats(ids[:-1], size) for ids in got)
    assert got != compare(engines, settings(1))
    compare(engines, settings(1, no_repeat_ngram_size=size), [[4, 5], [], [9], [], [6], [], [], []])


@pytest.mark.parametrize("size", [1, 2])
def test_no_repeat_ngram_beam(engines, size):
    got = compare(engines, settings(4, no_repeat_ngram_size=size))
    assert not any(repeats(ids[:-1], size) for ids in got)


@pytest.mark.parametrize("beam", BEAMS)
def test_sampling_topk_1(engines, beam):
    """Our sampling_topk 1 is off, CTranslate2's greedy: both the plain search."""
    compare(engines, settings(beam, sampling_topk=1))


def test_repetition_penalty_greedy(engines):
    """The same tokens and the model's log p; our scores are of the penalized log-probabilities,
    the engine's of the model's."""
    got = compare(engines, settings(1, repetition_penalty=3.0), scores_too=False)
    assert got != compare(engines, settings(1))


def test_sampling_follows_the_seed(engines, tmp_path):
    """n samples per source; engines made with the same seed draw the same ones (CTranslate2 seeds
    a thread's generator once, so the engine's settings hold the seed)."""
    _, engine, sources = engines
    sampling = settings(1, sampling_topk=0, sampling_temperature=2.0)

    def draw(seed):
        other = ctranslate2_engine.CTranslate2Translator(
            engine.model_dir, dataclasses.replace(sampling, seed=seed), 8, 3,
            compute_type="float32")
        found = other.run(sources)
        assert all(len(t.ids) == 3 and len(t.log_probs) == 3 for t in found)
        np.testing.assert_allclose(np.ravel([t.log_probs for t in found]), np.hstack(
            other.log_probs(sources, [outputs(t.ids) for t in found])[0]), rtol=1e-5)
        other.close()
        return [outputs(t.ids) for t in found]
    assert draw(5) == draw(5) != draw(6)


def test_the_option_flags_reach_the_engine_settings(tmp_path):
    """exported_hparams takes the option flags given on top of the export's settings, checked, and
    refuses --ensemble; DecodingSettings.from_flags carries them to the engine."""
    write_json(str(tmp_path / ctranslate2_engine.SETTINGS_FILE),
               {"beam_size": 4, "alpha": 0.6, "max_len_a": 1.5, "max_len_b": 10, "maxlen1": 20})
    (tmp_path / ctranslate2_engine.BPE_MODEL).write_bytes(b"")
    given = {"beam_size": 1, "min_len_b": 3, "no_repeat_ngram_size": 2, "sampling_topk": 5,
             "repetition_penalty": 1.5, "min_confidence": 0.2, "seed": 9}
    hp = ctranslate2_engine.exported_hparams(str(tmp_path), given, 8, 0)
    assert DecodingSettings.from_flags(hp) == DecodingSettings(
        beam_size=1, alpha=0.6, max_len_a=1.5, max_len_b=10, **{
            flag: value for flag, value in given.items() if flag != "beam_size"})
    with pytest.raises(UserError, match="^--ensemble needs --engine tensorflow: [^\n]*$"):
        ctranslate2_engine.exported_hparams(str(tmp_path), {"ensemble": ["run"]}, 8, 0)
    with pytest.raises(UserError, match="--sampling_topk samples one hypothesis at a time"):
        ctranslate2_engine.exported_hparams(str(tmp_path), {"sampling_topk": 5}, 8, 0)
    with pytest.raises(UserError, match="--no_repeat_ngram_size 17 is out of range"):
        ctranslate2_engine.exported_hparams(str(tmp_path), {"no_repeat_ngram_size": 17}, 8, 0)
