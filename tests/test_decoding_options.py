"""Decoding options (decoding.py's DecodingSettings and StepRules) held to exact properties: what a
target prefix forces and what follows it, the distributions sampling draws from, n-gram blocking,
the minimum length, the repetition penalty, the confidence, and a default graph without any of
them. Most tests decode with a small model trained to copy its input (peaked distributions, and
outputs that repeat when the input does); the sampling tests use random weights (flat ones)."""
import math

import numpy as np
import pytest
import tensorflow as tf

from decoding import (NEG_INF, DecodingSettings, StepRules, beam_search, confidences,
                      greedy_search, max_decoding_steps, penalize_repetitions, search, translate)
from model import ModelConfig, Transformer
from model_fixtures import build, random_ids, small_hp, train_step
from toolkit.base.ids import BOS_ID, EOS_ID, PAD_ID

tf1 = tf.compat.v1

IMPLS = ("fast", "reference")
VOCAB = small_hp().vocab_size
#: Sources of mixed lengths with extra padding; most repeat a pattern, which a copy repeats.
SOURCES = np.array([[5, 6, 5, 6, 5, 6, 5, 3, 0, 0],
                    [7, 8, 9, 7, 8, 9, 7, 8, 3, 0],
                    [12, 12, 12, 12, 3, 0, 0, 0, 0, 0],
                    [20, 21, 22, 3, 0, 0, 0, 0, 0, 0],
                    [30, 31, 30, 31, 32, 33, 30, 31, 3, 0],
                    [14, 3, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
#: Target prefixes of SOURCES, of different lengths (the second one empty), padded with 0.
PREFIXES = np.array([[9, 10, 11, 0, 0],
                     [0, 0, 0, 0, 0],
                     [25, 0, 0, 0, 0],
                     [20, 21, 22, 23, 24],
                     [30, 31, 0, 0, 0],
                     [4, 4, 4, 4, 0]], np.int32)


class Decoder:
    """One graph with a model on each path (the fast and the reference one, over the same
    variables), and their decodings, built on first use and run on numpy batches in sess (set
    once the variables are initialized). Builds the teacher-forced models of both paths, so
    every variable exists once it is made."""

    def __init__(self, graph, models, ph):
        self.graph, self.models, self.ph, self.sess = graph, models, ph, None
        with graph.as_default():
            self.prefix = tf1.placeholder(tf.int32, [None, None])
            self.ids = tf1.placeholder(tf.int32, [None, None])
        self.ops = {}
        for impl in models:
            self._op(("score", impl), lambda: models[impl].score(ph.xs, self.ids, 0.0))
            self._op(("logits", impl), lambda: models[impl].teacher_forced(ph.xs, self.ids)[0])

    def _op(self, key, build_fn):
        if key not in self.ops:
            with self.graph.as_default():
                self.ops[key] = build_fn()
        return self.ops[key]

    def placeholder(self, name, dtype):
        """A scalar placeholder, to feed an option's value as a server does."""
        return self._op(("placeholder", name), lambda: tf1.placeholder(dtype, [], name))

    def search(self, impl, settings, n=1, x=SOURCES, prefix=None, fed=None):
        """search()'s ids (N, n, T), scores (N, n) and the model's log-probabilities (N, n).
        fed: {placeholder: value} of the options that settings hold as placeholders."""
        op = self._op(("search", impl, settings, n, prefix is not None), lambda: search(
            self.models[impl], self.ph.xs, settings, n, None if prefix is None else self.prefix))
        feed = {**self.ph.feed(x), **(fed or {})}
        if prefix is not None:
            feed[self.prefix] = prefix
        return self.sess.run(op, feed)

    def log_probs(self, impl, x, ids):
        """The model's log p(ids | x) (N,), teacher-forced: model.score with alpha 0."""
        op = self.ops["score", impl]
        return self.sess.run(op, {**self.ph.feed(x), self.ids: ids})

    def logits(self, impl, x, ids):
        """The teacher-forced logits (N, T, V): position t's given ids[:, :t]."""
        op = self.ops["logits", impl]
        return self.sess.run(op, {**self.ph.feed(x), self.ids: ids})


@pytest.fixture(scope="module")
def trained():
    """A Decoder of a 2-block model trained 600 steps to copy its input (conftest.py marks the
    tests that use it slow)."""
    rng = np.random.RandomState(0)
    hp = small_hp()
    graph = tf.Graph()
    with graph.as_default():
        model, ph = build(hp)
        reference = Transformer(ModelConfig.from_flags(small_hp(impl="reference")))
        train_op = train_step(hp, ph).batch["update"]
        trained_variables = len(tf1.global_variables())
        decoder = Decoder(graph, {"fast": model, "reference": reference}, ph)
        assert len(tf1.global_variables()) == trained_variables  # both paths use the trained ones
        decoder.sess = tf1.Session(graph=graph)
        decoder.sess.run(tf1.global_variables_initializer())
    for _ in range(600):
        x = random_ids(rng, rng.randint(3, 11, 32), hp.vocab_size)
        decoder.sess.run(train_op, ph.feed(x, x))
    yield decoder
    decoder.sess.close()


def random_decoder():
    """A Decoder of a model with random weights (the same ones in every new graph: build seeds
    them), on the fast path."""
    graph = tf.Graph()
    with graph.as_default():
        model, ph = build(small_hp())
        decoder = Decoder(graph, {"fast": model}, ph)
        decoder.sess = tf1.Session(graph=graph)
        decoder.sess.run(tf1.global_variables_initializer())
    return decoder


@pytest.fixture(scope="module")
def untrained():
    """A random_decoder, whose flat distributions make any sampling show."""
    decoder = random_decoder()
    yield decoder
    decoder.sess.close()


# ---------------------------------------------------------------- helpers computed by hand
def lengths_of(ids):
    """Tokens before </s> in each row of ids (..., T)."""
    return (ids != PAD_ID).sum(-1) - 1


def filled(scores):
    """Which hypotheses a search filled (an empty beam slot scores NEG_INF)."""
    return scores > NEG_INF / 2


def pad_to(ids, width):
    return np.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(0, width - ids.shape[-1])])


def log_softmax(logits):
    """float64 log_softmax over the last axis, with <pad> and <s> -inf (decoding_log_probs)."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    out = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    out[..., [PAD_ID, BOS_ID]] = -np.inf
    return out


def search_log_softmax(logits):
    """The distribution an option's search step chooses from: float64 log_softmax over the last
    axis renormalized without <pad> and <s> (-inf), as CTranslate2's is."""
    logits = np.array(logits, np.float64)
    logits[..., [PAD_ID, BOS_ID]] = -np.inf
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def hand_penalized(logits, history, penalty):
    """CTranslate2's repetition penalty, by hand: the logits of the tokens in history (a list of
    ids) divided by penalty when positive, multiplied when negative."""
    out = np.array(logits, np.float32)
    seen = sorted(set(int(token) for token in history))
    out[seen] = np.where(out[seen] < 0, out[seen] * np.float32(penalty),
                         out[seen] / np.float32(penalty))
    return out


def ngram_counts(tokens, n):
    """{n-gram: how many times} over the non-pad tokens of a row."""
    tokens = [int(t) for t in tokens if t != PAD_ID]
    counts = {}
    for i in range(len(tokens) - n + 1):
        counts[tuple(tokens[i:i + n])] = counts.get(tuple(tokens[i:i + n]), 0) + 1
    return counts


def step_limits(x, prefix, settings):
    """max_decoding_steps by hand, with the room a prefix needs: ceil(a * len + b), at least the
    prefix's length + 1."""
    limits = np.ceil(settings.max_len_a * ((x != PAD_ID).sum(1) - 1) + settings.max_len_b)
    return np.maximum(limits.astype(int), (prefix != PAD_ID).sum(1) + 1)


def chi2_sf(statistic, df):
    """P(X >= statistic) for X chi-square with df degrees of freedom: 1 - P(df/2, statistic/2),
    the regularized lower incomplete gamma function by its power series (Abramowitz and Stegun
    6.5.29), which converges for every statistic; scipy is not installed."""
    a, x = df / 2.0, statistic / 2.0
    term = total = 1.0 / a
    for n in range(1, 1000):
        term *= x / (a + n)
        total += term
        if term < 1e-17 * total:
            break
    return max(0.0, 1.0 - math.exp(a * math.log(x) - x - math.lgamma(a)) * total)


# ---------------------------------------------------------------- 1. prefix
def teacher_forced_greedy(decoder, impl, x, prefix, settings):
    """Greedy decoding after each prefix, derived without StepRules: at each step the argmax of
    the teacher-forced logits of the tokens so far (<pad> and <s> excluded), </s> at the step
    limit, until every row has output </s>. Returns ids (N, T)."""
    limits = step_limits(x, prefix, settings)
    rows = [[int(t) for t in p if t != PAD_ID] for p in prefix]
    done = [False] * len(rows)
    while not all(done):
        width = max(len(row) for row in rows) + 1
        # any token after a row: position t's logits see only the ids before t
        ids = np.full([len(rows), width], 4, np.int32)
        for ids_row, row in zip(ids, rows):
            ids_row[:len(row)] = row
        logits = decoder.logits(impl, x, ids)
        for i, row in enumerate(rows):
            if done[i]:
                continue
            if len(row) + 1 >= limits[i]:
                token = EOS_ID
            else:
                token = int(np.argmax(log_softmax(logits[i, len(row)])))
            row.append(token)
            done[i] = token == EOS_ID
    ids = np.zeros([len(rows), max(len(row) for row in rows)], np.int32)
    for ids_row, row in zip(ids, rows):
        ids_row[:len(row)] = row
    return ids


@pytest.mark.parametrize("impl", IMPLS)
def test_every_output_starts_with_its_prefix_and_greedy_continues_it(trained, impl):
    """Every output, greedy and each of beam 4's, starts with its prefix (lengths 0 to 5); and
    greedy decoding after the prefix is the argmax continuation of the model teacher-forced on
    the prefix, computed step by step outside the search, also (fast path: the rule is the
    shared search's) under a step limit shorter than some prefixes, which then get the prefix's
    length + 1 steps."""
    lengths = (PREFIXES != PAD_ID).sum(1)
    greedy = DecodingSettings()
    ids, _, _ = trained.search(impl, greedy, prefix=PREFIXES)
    beam_ids, beam_scores, _ = trained.search(impl, DecodingSettings(beam_size=4), 4,
                                              prefix=PREFIXES)
    for i, length in enumerate(lengths):
        np.testing.assert_array_equal(ids[i, 0, :length], PREFIXES[i, :length])
        for k in np.flatnonzero(filled(beam_scores[i])):
            np.testing.assert_array_equal(beam_ids[i, k, :length], PREFIXES[i, :length])
    expected = teacher_forced_greedy(trained, impl, SOURCES, PREFIXES, greedy)
    width = max(expected.shape[1], ids.shape[2])
    np.testing.assert_array_equal(pad_to(ids[:, 0], width), pad_to(expected, width))
    if impl == "fast":  # with a step limit of 3, longer prefixes get room for them and </s>
        short = DecodingSettings(max_len_a=0.0, max_len_b=3)
        ids_short, _, _ = trained.search(impl, short, prefix=PREFIXES)
        expected = teacher_forced_greedy(trained, impl, SOURCES, PREFIXES, short)
        np.testing.assert_array_equal(lengths_of(expected), np.maximum(lengths, 2))
        width = max(expected.shape[1], ids_short.shape[2])
        np.testing.assert_array_equal(pad_to(ids_short[:, 0], width), pad_to(expected, width))
    # the empty prefix decodes as no prefix at all
    free, _, _ = trained.search(impl, greedy)
    width = max(free.shape[2], ids.shape[2])
    np.testing.assert_array_equal(pad_to(ids[1, 0], width), pad_to(free[1, 0], width))


# ---------------------------------------------------------------- 2. sampling
def test_sampling_from_the_one_most_probable_token_is_greedy(trained):
    """sampling_topk 1 fed as a tensor (as a server feeds it: the option is on) draws the most
    probable token each step: the ids and scores of greedy decoding."""
    with trained.graph.as_default():
        top1 = DecodingSettings(sampling_topk=tf.constant(1), seed=3)
    ids, scores, log_probs = trained.search("fast", top1)
    greedy_ids, greedy_scores, greedy_log_probs = trained.search("fast", DecodingSettings())
    np.testing.assert_array_equal(ids, greedy_ids)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5)
    np.testing.assert_allclose(log_probs, greedy_log_probs, rtol=1e-5)


def test_sampling_topk_1_is_greedy_whatever_the_temperature(untrained):
    """--sampling_topk 1 is 'no sampling, take the most probable' (hparams.py's help; in
    CTranslate2 sampling_topk 1 is greedy search whatever sampling_temperature says: its
    make_sampler picks the BestSampler): with a temperature of 2 as well, the output is greedy
    decoding's. Random weights, whose flat distributions make any sampling show."""
    ids, scores, _ = untrained.search("fast", DecodingSettings(sampling_temperature=2.0))
    greedy_ids, greedy_scores, _ = untrained.search("fast", DecodingSettings())
    np.testing.assert_array_equal(ids, greedy_ids)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5)


def test_the_same_seed_draws_the_same_samples():
    """Two new graphs and sessions with the same settings.seed draw the same 8 samples of each
    source (ids and scores); another seed draws others, so the seed is what fixes them. Random
    weights, whose flat distributions make samples differ."""
    def draw(*seeds):
        decoder = random_decoder()
        with decoder.sess:
            return [decoder.search("fast", DecodingSettings(sampling_topk=0, seed=seed), 8)
                    for seed in seeds]
    (first,), (second, other) = draw(7), draw(7, 8)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    width = max(first[0].shape[2], other[0].shape[2])
    assert (pad_to(first[0], width) != pad_to(other[0], width)).any()


#: Upper 0.1% points of the chi-square distribution (NIST/SEMATECH e-Handbook of Statistical
#: Methods, section 1.3.6.7.4), to check chi2_sf: {degrees of freedom: the 0.999 quantile}.
CHI2_999 = {1: 10.828, 2: 13.816, 4: 18.467, 9: 27.877, 20: 45.315}


def test_chi2_sf_matches_the_tables_upper_points():
    """chi2_sf, which the sampling test's p-values come from, gives 0.001 at the table's 0.999
    quantiles (to the table's 3 decimals), and exp(-x/2) for 2 degrees of freedom."""
    for df, quantile in CHI2_999.items():
        assert abs(chi2_sf(quantile, df) - 0.001) < 2e-6, df
    assert abs(chi2_sf(7.3, 2) - math.exp(-3.65)) < 1e-12


@pytest.mark.parametrize("settings, samples", [
    (DecodingSettings(sampling_topk=5, sampling_temperature=0.7, max_len_a=0, max_len_b=2), 2000),
    (DecodingSettings(sampling_topk=0, sampling_topp=0.5, sampling_temperature=1.5, max_len_a=0,
                      max_len_b=2), 4000)], ids=["top_k", "top_p"])
def test_first_tokens_follow_the_tempered_truncated_softmax(untrained, settings, samples):
    """n samples of one source's first token: their frequencies fit softmax(first-step log
    probabilities / temperature) restricted to the top k, or to the nucleus of top p (the fewest
    most probable tokens whose probabilities add up to p), by a chi-square test at p >= 0.001,
    and no token outside is ever drawn. The first-step logits are the model's, teacher-forced on
    a one-token output, with <pad> and <s> excluded; random weights, for many probable tokens."""
    x = SOURCES[:1]
    logits = untrained.logits("fast", x, np.array([[EOS_ID]], np.int32))[0, 0]
    ids, _, _ = untrained.search("fast", settings, samples, x=x)
    probs = np.exp(log_softmax(logits) / settings.sampling_temperature)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    if settings.sampling_topk:
        kept = order[:settings.sampling_topk]
        # the k-th and the next are apart: float rounding cannot change which is kept
        assert probs[order[settings.sampling_topk - 1]] > probs[order[settings.sampling_topk]] * (
            1 + 1e-4)
    else:
        before = np.cumsum(probs[order]) - probs[order]  # what the tokens ranked before hold
        kept = order[before < settings.sampling_topp]
        assert np.abs(before - settings.sampling_topp).min() > 1e-4  # a clear boundary
    expected = np.zeros(VOCAB)
    expected[kept] = probs[kept] / probs[kept].sum() * samples
    assert len(kept) >= 3 and expected[kept].min() >= 5, expected[kept]  # a valid test
    counts = np.bincount(ids[0, :, 0], minlength=VOCAB)
    outside = np.setdiff1d(np.arange(VOCAB), kept)
    assert counts[outside].sum() == 0, {int(t): int(counts[t]) for t in outside if counts[t]}
    statistic = (((counts - expected)[kept]) ** 2 / expected[kept]).sum()
    assert chi2_sf(statistic, len(kept) - 1) >= 0.001, (statistic, len(kept))


# ---------------------------------------------------------------- 3. n-gram blocking
@pytest.mark.parametrize("size", [1, 2, 3])
def test_no_output_repeats_an_ngram(trained, size):
    """no_repeat_ngram_size N: no output of greedy decoding or beam 4 (every hypothesis) holds
    an N-gram twice, where the same search without the option does (the copier copies the
    sources' repeated patterns)."""
    def repeats(ids):
        return max(ngram_counts(ids, size).values(), default=0) > 1
    for beam in (1, 4):
        free, _, _ = trained.search("fast", DecodingSettings(beam_size=beam), beam)
        assert any(repeats(row) for row in free[:, 0]), free[:, 0]
        settings = DecodingSettings(beam_size=beam, no_repeat_ngram_size=size)
        ids, scores, _ = trained.search("fast", settings, beam)
        for i, k in zip(*np.nonzero(filled(scores))):
            assert not repeats(ids[i, k]), (beam, i, k, ids[i, k])
        assert filled(scores)[:, 0].all()


# ---------------------------------------------------------------- 4. minimum length
def test_no_output_is_shorter_than_the_minimum(trained):
    """min_len_a a, min_len_b b (fed, as a server feeds them): every output of greedy decoding and
    beam 4 has at least ceil(a * source length + b) tokens before </s> (source length without
    </s>), where the copier without the option stops earlier."""
    a, b = trained.placeholder("min_len_a", tf.float32), trained.placeholder("min_len_b", tf.int32)
    for beam in (1, 4):
        free, _, _ = trained.search("fast", DecodingSettings(beam_size=beam), beam)
        settings = DecodingSettings(beam_size=beam, min_len_a=a, min_len_b=b)
        for a_value, b_value in ((1.0, 3), (0.5, 9)):
            minimum = np.ceil(a_value * lengths_of(SOURCES) + b_value).astype(int)
            assert (lengths_of(free[:, 0]) < minimum).any()
            ids, scores, _ = trained.search("fast", settings, beam, fed={a: a_value, b: b_value})
            assert filled(scores).all()
            assert (lengths_of(ids) >= minimum[:, None]).all(), (minimum, lengths_of(ids))
            assert (ids == EOS_ID).sum(-1).min() == 1


# ---------------------------------------------------------------- 5. repetition penalty
def test_penalize_repetitions_is_ctranslate2s_penalty():
    """penalize_repetitions divides the positive logits of tokens in the history by the penalty
    and multiplies the negative ones, each token once however often it occurs; StepRules' step
    gives the log_softmax of those logits (without <pad> and <s>) to choose from and the model's
    own beside them."""
    rng = np.random.RandomState(1)
    logits = rng.randn(3, 12).astype(np.float32) * 3
    logits[0, 6] = 0.0
    history = np.array([[4, 5, 6, 4], [7, 7, 7, 7], [11, 8, 9, 10]], np.int32)
    with tf.Graph().as_default(), tf1.Session() as sess:
        penalized = penalize_repetitions(tf.constant(logits), tf.constant(history), 1.7)
        rules = StepRules(DecodingSettings(repetition_penalty=1.7))
        step = rules.log_probs(tf.constant(logits), tf.constant(history), tf.constant(4),
                               tf.zeros([3], tf.bool))
        penalized, (search_log_probs, model_log_probs) = sess.run([penalized, step])
    expected = np.stack([hand_penalized(row, seen, 1.7) for row, seen in zip(logits, history)])
    np.testing.assert_allclose(penalized, expected, rtol=1e-6)
    assert (penalized != logits).sum() == 2 + 1 + 4  # the 0 logit stays 0
    for got, want in ((search_log_probs, search_log_softmax(expected)),
                      (model_log_probs, log_softmax(logits))):
        allowed = np.isfinite(want)
        np.testing.assert_allclose(got[allowed], want[allowed], atol=1e-5)
        assert (got[~allowed] == NEG_INF).all()


def test_greedy_decoding_with_a_repetition_penalty_takes_the_penalized_argmax(trained):
    """Greedy decoding with repetition_penalty 3: each token (but the step limit's </s>) is the
    argmax of the teacher-forced logits penalized by hand for the tokens before it; the score is
    the sum of those penalized log-probabilities (alpha 0), the log-probability the model's own.
    The copier's copies of repeated patterns change under the penalty."""
    settings = DecodingSettings(repetition_penalty=3.0, alpha=0.0)
    ids, scores, log_probs = (t[:, 0] for t in trained.search("fast", settings))
    free, _, _ = trained.search("fast", DecodingSettings())
    width = max(ids.shape[1], free.shape[2])
    assert (pad_to(ids, width) != pad_to(free[:, 0], width)).any()
    logits = trained.logits("fast", SOURCES, ids)
    limits = step_limits(SOURCES, np.zeros([len(ids), 1], np.int32), settings)
    for i, row in enumerate(ids):
        search_total = model_total = 0.0
        for t in range(lengths_of(row) + 1):
            penalized = search_log_softmax(hand_penalized(logits[i, t], row[:t], 3.0))
            if t + 1 < limits[i]:
                assert row[t] == np.argmax(penalized), (i, t, row)
            search_total += penalized[row[t]]
            model_total += log_softmax(logits[i, t])[row[t]]
        np.testing.assert_allclose(scores[i], search_total, atol=1e-4)
        np.testing.assert_allclose(log_probs[i], model_total, atol=1e-4)
    assert np.abs(scores - log_probs).max() > 0.01  # the penalty changed what the search saw


# ---------------------------------------------------------------- 6. confidence
#: (settings, prefixes, paths) of the confidence test: searches without options on both paths (whose
#: per-step logits differ), with options on the fast one (the search code is shared).
CONFIDENCE_CASES = {
    "greedy": (DecodingSettings(), None, IMPLS),
    "beam4": (DecodingSettings(beam_size=4), None, IMPLS),
    "greedy_prefix": (DecodingSettings(), PREFIXES, IMPLS),
    "beam4_prefix": (DecodingSettings(beam_size=4), PREFIXES, IMPLS),
    "greedy_ngram2": (DecodingSettings(no_repeat_ngram_size=2), None, ("fast",)),
    "beam4_ngram2": (DecodingSettings(beam_size=4, no_repeat_ngram_size=2), None, ("fast",)),
    "greedy_penalty": (DecodingSettings(repetition_penalty=2.0), None, ("fast",)),
    "beam4_penalty_minlen": (DecodingSettings(beam_size=4, repetition_penalty=2.0, min_len_b=6),
                             None, ("fast",)),
}


@pytest.mark.parametrize("case, impl", [(case, impl) for case, (_, _, impls)
                                        in CONFIDENCE_CASES.items() for impl in impls])
def test_confidence_is_the_models_teacher_forced_mean_log_probability(trained, impl, case):
    """confidences(ids, log_probs) of search's outputs (every filled hypothesis of a beam) is
    exp(model.score(xs, ids, alpha=0) / tokens with </s>), teacher-forced (translate.py --score's
    LOGPROB), within 1e-5 relative: log_probs stay the model's when an option changes what the
    search chooses from, and a prefix's forced tokens count at the model's log-probability."""
    settings, prefix, _ = CONFIDENCE_CASES[case]
    n = settings.beam_size
    ids, scores, log_probs = trained.search(impl, settings, n, prefix=prefix)
    keep = filled(scores)
    rows = np.repeat(SOURCES, n, axis=0)[keep.reshape(-1)]
    forced = trained.log_probs(impl, rows, ids[keep])
    tokens = (ids[keep] != PAD_ID).sum(-1)
    np.testing.assert_allclose(confidences(ids, log_probs)[keep], np.exp(forced / tokens),
                               rtol=1e-5)


# ---------------------------------------------------------------- 7. off means free
def op_types(graph):
    """The op types of a graph, its while loops' bodies (functions of its library) included."""
    graph_def = graph.as_graph_def()
    return ({node.op for node in graph_def.node}
            | {node.op for function in graph_def.library.function for node in function.node_def})


def decoding_graph(*settings, beam=1):
    """The op types of a graph of translate(s) for each of settings on random weights, or with
    none, of the model's search (greedy, or a beam of beam) called by hand without any StepRules
    (the code before the options)."""
    graph = tf.Graph()
    with graph.as_default():
        model, ph = build(small_hp())
        for each in settings:
            translate(model, ph.xs, each)
        if not settings:
            memory, src_masks = model.encode(ph.xs, training=False)
            max_steps = max_decoding_steps(ph.xs.x_seqlen, 1.5, 10)
            if beam > 1:
                memory, src_masks = (tf.repeat(t, beam, axis=0) for t in (memory, src_masks))
            step_fn, state = model.cached_decoder(memory, src_masks)
            if beam > 1:
                beam_search(step_fn, state, max_steps, beam, 0.6)
            else:
                greedy_search(step_fn, state, max_steps, 0.6)
    return op_types(graph)


#: Op types that each option adds to the searches without StepRules (each option alone adds one
#: of them at least): StepRules' log_softmax (greedy_search's default takes logit - logsumexp),
#: the minimum length's reduce_any of bans, sampling's Multinomial, n-gram blocking's and the
#: repetition penalty's ScatterNd.
OPTION_OPS = {"greedy": {"LogSoftmax", "Multinomial", "ScatterNd"}, "beam": {"ScatterNd"}}


def test_default_settings_add_no_op_of_the_options():
    """translate() with default settings (greedy, and beam 4) builds exactly the op types of the
    searches without StepRules, so none of those the options add (OPTION_OPS, found in a graph
    with every option on: so a leak of any option into the default path fails the test)."""
    options = decoding_graph(
        DecodingSettings(min_len_b=2, sampling_topk=5, sampling_topp=0.9,
                         sampling_temperature=0.8, no_repeat_ngram_size=2, repetition_penalty=1.2),
        DecodingSettings(beam_size=4, min_len_b=2, no_repeat_ngram_size=2, repetition_penalty=1.2))
    for search_kind, default, bare in (
            ("greedy", decoding_graph(DecodingSettings()), decoding_graph()),
            ("beam", decoding_graph(DecodingSettings(beam_size=4)), decoding_graph(beam=4))):
        assert OPTION_OPS[search_kind] <= options - bare, options - bare
        assert not default & OPTION_OPS[search_kind], default & OPTION_OPS[search_kind]
        assert default == bare, default ^ bare
