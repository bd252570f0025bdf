"""Decoding: a model's translations, greedy, by beam search or by sampling, each batch inside one
tf.while_loop (Vaswani et al., 2017, Section 6.1: beam search with a length penalty, outputs at
most a constant longer than the input).

    settings = DecodingSettings(beam_size=4, alpha=0.6)    # or DecodingSettings.from_flags(hp)
    ids, scores = translate(model, xs, settings)           # the best: (N, T), (N,)
    ids, scores = nbest(model, xs, settings, n)            # the n best: (N, n, T), (N, n)
    ids, scores, log_probs = search(model, xs, settings, n, prefix)
        # and the model's log p(ids) (N, n), whose mean per token is the confidence

model is a model.Transformer, or an Ensemble of several; xs = data_load.Sources(x (N, T1),
x_seqlen (N,)). The searches run a step function, step_fn(tokens (B,), step, state[, parents]) ->
logits (B, V), new state, that the model builds (Transformer.cached_decoder: its decoder stack one
position at a time). The options of DecodingSettings (a minimum length, sampling, n-gram blocking, a
repetition penalty) and a target prefix are steps of StepRules, between the logits and the choice of
a token; with every option off the searches run as they did before the options existed. This module
knows logits, tokens and the cache's layout (B, h, L, d), not the model's layers; grow_cache and
write_in_place serve the fast model's cache (fast.model.FastTransformer), which grows in chunks
about as long as what was decoded and is written without copies.
"""
import collections
import contextlib
import dataclasses

import numpy as np
import tensorflow as tf

from toolkit.base.ids import BOS_ID, EOS_ID, PAD_ID

tf1 = tf.compat.v1

#: Stands in for log(0) in decoding: finite, so sums and differences never turn into NaN.
NEG_INF = -1e9


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode, with the defaults of hparams.py's flags of the same names (CTranslate2's names
    for the options it shares). Each option at its default is off: it adds nothing to the graph.

    beam_size hypotheses per sentence (1: greedy decoding); alpha of length_penalty; at most
    max_len_a * source length + max_len_b steps per sentence (max_decoding_steps), and at least
    min_len_a * source length + min_len_b tokens before </s> (min_decoding_lengths);
    sampling_topk other than 1 (0: the whole vocabulary) samples each token (sample_tokens) instead
    of taking the most probable, under seed, shaped by sampling_topp and sampling_temperature;
    no_repeat_ngram_size: no n-gram of that size twice in an output (repeated_ngram_bans);
    repetition_penalty: the logits of tokens already output divided by it when positive,
    multiplied when negative (penalize_repetitions); min_confidence: a translation whose
    confidence (the geometric mean of its tokens' probabilities) is below it is dropped, by the tool
    that prints it. Any numeric option but beam_size and no_repeat_ngram_size may be a scalar tensor
    (a value fed per batch), which counts as on."""
    beam_size: int = 1
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    min_len_a: float = 0.0
    min_len_b: int = 0
    sampling_topk: int = 1
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    min_confidence: float = 0.0
    seed: int = 0

    @classmethod
    def from_flags(cls, hp):
        """The settings of parsed flags hp: --beam_size, --alpha, --max_len_a, --max_len_b, and
        those of the options (hparams.DECODING_OPTIONS) and --seed that the tool has (train.py's
        dev translations use none of them)."""
        return cls(**{field.name: getattr(hp, field.name) for field in dataclasses.fields(cls)
                      if hasattr(hp, field.name)})

    def uses(self, option):
        """Whether an option is on: given a tensor, or a value other than its default."""
        value = getattr(self, option)
        return isinstance(value, tf.Tensor) or value != OPTION_DEFAULTS[option]

    def samples(self):
        """Whether tokens are drawn (sample_tokens) rather than chosen by greedy or beam search:
        sampling_topk other than 1, as in CTranslate2 (the temperature and top-p shape a draw)."""
        return self.uses("sampling_topk")

    def reshapes_distribution(self):
        """Whether an option changes the log-probabilities the search chooses from (so that the
        model's own log-probabilities are kept apart, for the confidence)."""
        return any(self.uses(option) for option in DISTRIBUTION_OPTIONS)


#: The options' defaults, which leave them off.
OPTION_DEFAULTS = {field.name: field.default for field in dataclasses.fields(DecodingSettings)}
#: The options that sample tokens.
SAMPLING_OPTIONS = ("sampling_topk", "sampling_topp", "sampling_temperature")
#: The options that change the distribution a search step chooses from.
DISTRIBUTION_OPTIONS = ("min_len_a", "min_len_b", "no_repeat_ngram_size", "repetition_penalty")
#: The options a server takes per request as numbers fed to its graph (Translator): the graph
#: depends only on which of them are on.
FED_OPTIONS = ("min_len_a", "min_len_b", "sampling_topk", "sampling_topp", "sampling_temperature",
               "repetition_penalty")


def length_penalty(length, alpha):
    """((5 + length) / 6) ^ alpha (Wu et al., 2016, Section 7). length: tensor of any
    shape; returns float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def max_decoding_steps(x_seqlen, max_len_a, max_len_b):
    """ceil(a * source_length + b) for each sentence (Section 6.1 allows source length + 50);
    x_seqlen (N,) counts </s>. Returns (N,) int32."""
    return tf.cast(tf.math.ceil(max_len_a * tf.cast(x_seqlen - 1, tf.float32) + max_len_b),
                   tf.int32)


def banned_outputs(vocab_size):
    """(V,) bool: the ids a decoder never outputs, <pad> and <s>."""
    return np.isin(np.arange(vocab_size), [PAD_ID, BOS_ID])


def decoding_log_probs(logits, must_end=None):
    """log_softmax over the vocabulary with <pad> and <s> made impossible outputs (log-probability
    NEG_INF), and every token but </s> where must_end. logits: (..., V). must_end: None, or (B,)
    bool over the first axis of logits (B, V) or (B, K, V). The masks of both cases are picked per
    row, so one select writes the result."""
    vocab_size = logits.shape[-1]
    banned = banned_outputs(vocab_size)  # (V,)
    if must_end is not None:
        # (2, V): ordinary, last step
        masks = tf.constant(np.stack([banned, np.arange(vocab_size) != EOS_ID]))
        banned = tf.gather(masks, tf.cast(must_end, tf.int32))  # (B, V)
        banned = tf.reshape(banned, [-1] + [1] * (len(logits.shape) - 2) + [vocab_size])
    return tf.where(banned, tf.cast(NEG_INF, tf.float32),
                    tf.nn.log_softmax(tf.cast(logits, tf.float32)))


def greedy_choice(logits, must_end):
    """The most probable output of each row, or </s> where must_end, and its log-probability: what
    an argmax over decoding_log_probs(logits, must_end) picks, with no (N, V) mask to build or
    select through.
    logits: (N, V). must_end: (N,) bool. Returns tokens (N,) int32 and their
    log-probabilities (N,) float32.

    Only the chosen logit needs normalizing, so log p = logit - logsumexp(logits) replaces a whole
    log_softmax (which writes N x V values and runs slower than the max, exp and sum it
    is made of)."""
    logits = tf.cast(logits, tf.float32)
    # (V,)
    banned = tf.constant(np.where(banned_outputs(logits.shape[-1]), NEG_INF,
                                  0.0).astype(np.float32))
    best = tf.cast(tf.argmax(logits + banned, axis=-1), tf.int32)
    tokens = tf.where(must_end, EOS_ID, best)
    # (N, 1): exp(logits - top) <= 1 never overflows
    top = tf.reduce_max(logits, axis=-1, keepdims=True)
    log_z = tf.math.log(tf.reduce_sum(tf.exp(logits - top), axis=-1)) + top[:, 0]  # (N,)
    return tokens, tf.gather(logits, tokens, batch_dims=1) - log_z


def write_in_place(cache, rows, values):
    """cache (B, ...) seen as rows (R, d) with rows[i] set to values[i] (values: (len(rows), d)), IN
    PLACE: the buffer of `cache` is overwritten, not copied, so nothing else may read it afterwards.
    The decoding loops pass each cache tensor only from one step to the next (through grow_cache,
    and through tf.gather, which copies), and the values written at step t + 1 depend on the tokens
    of step t, which depend on every read of the cache at step t; so each step can write its keys
    and values without copying the whole cache. Returns the updated cache, in cache's shape."""
    rows_view = tf.reshape(cache, [-1, values.shape[-1]])  # (R, d), the same buffer
    return tf.reshape(tf.raw_ops.InplaceUpdate(x=rows_view, i=rows, v=values), tf.shape(cache))


#: Positions the decoding cache grows by at a time.
CACHE_CHUNK = 16


def grow_cache(cache, step, chunk=CACHE_CHUNK):
    """The decoding cache with `chunk` more positions, zeros, when step reaches its length L, else
    as it is.

    cache: list of (K, V) pairs, each (B, h, L, d). step: scalar int32, at most L. Pad with no
    padding passes its input through without a copy, and one that grows copies into a new buffer of
    its own, which write_in_place may then overwrite. Returns the list of pairs, each (B, h, L or L
    + chunk, d)."""
    extra = tf.where(step >= tf.shape(cache[0][0])[2], chunk, 0)
    paddings = tf.constant([[0, 0], [0, 0], [0, 1], [0, 0]]) * extra  # after the last position only

    def pad(t):
        padded = tf.pad(t, paddings)
        # what tf.pad cannot infer from a computed paddings
        padded.set_shape([None, None, None, t.shape[-1]])
        return padded
    return [tuple(pad(t) for t in pair) for pair in cache]


#: Entries per block in top_k_by_blocks.
TOP_K_BLOCK = 64


def top_k_by_blocks(scores, k, block=TOP_K_BLOCK):
    """tf.math.top_k(scores, k) (ties: lower index first) in two cheaper stages. scores:
    (N, M) float.

    The row is cut into blocks of `block` entries (the last one padded with the dtype's lowest
    value); the k blocks with the largest maxima hold the k largest entries (a block left out has k
    blocks before it, each with an entry that ranks before every entry of it), and one top-k over
    those k * block entries, taken in index order, ranks them as a top-k over the whole row would. A
    max per block and two small top-ks read the row once instead of running a top-k over all M
    entries. Returns values (N, k) and indices (N, k) into M.
    """
    length = scores.shape[-1]
    num_blocks = -(-length // block)
    if num_blocks <= k:
        return tf.math.top_k(scores, k)
    if num_blocks * block != length:
        scores = tf.pad(scores, [[0, 0], [0, num_blocks * block - length]],
                        constant_values=scores.dtype.min)
    blocks = tf.reshape(scores, [-1, num_blocks, block])  # (N, M / block, block)
    _, best = tf.math.top_k(tf.reduce_max(blocks, axis=-1), k)  # (N, k)
    best = tf.sort(best, axis=-1)  # in index order, so that equal entries keep their order
    pool = tf.reshape(tf.gather(blocks, best, batch_dims=1), [-1, k * block])  # (N, k * block)
    values, position = tf.math.top_k(pool, k)
    return values, tf.gather(best, position // block, batch_dims=1) * block + position % block


# ---------------------------------------------------------------- the options, one step each
def min_decoding_lengths(x_seqlen, min_len_a, min_len_b):
    """ceil(a * source length + b) tokens before </s> for each sentence, the mirror of
    max_decoding_steps; x_seqlen (N,) counts </s>. Returns (N,) int32."""
    return tf.cast(tf.math.ceil(min_len_a * tf.cast(x_seqlen - 1, tf.float32)
                                + tf.cast(min_len_b, tf.float32)), tf.int32)


def token_counts(history, vocab_size):
    """(B, V) float32: how many times each token is in each row of history (B, t) int32."""
    rows = tf.broadcast_to(tf.range(tf.shape(history)[0])[:, None], tf.shape(history))
    indices = tf.reshape(tf.stack([rows, history], -1), [-1, 2])  # (B*t, 2)
    return tf.scatter_nd(indices, tf.ones([tf.shape(indices)[0]]),
                         [tf.shape(history)[0], vocab_size])


def penalize_repetitions(logits, history, penalty):
    """CTranslate2's repetition penalty: the logit of every token in history (B, t) divided by
    penalty when positive, multiplied by it when negative. logits: (B, V) float32."""
    seen = token_counts(history, logits.shape[-1]) > 0  # (B, V)
    return tf.where(seen, tf.where(logits < 0, logits * penalty, logits / penalty), logits)


def repeated_ngram_bans(history, n, vocab_size):
    """(B, V) bool: the tokens that would end an n-gram already in history (B, t), after its last n
    - 1 tokens. The n-gram ending at history[:, j] is a frame of history padded on the left with n
    - 1 entries of -1 (no token), so frames that start before the output never match."""
    padded = tf.pad(history, [[0, 0], [n - 1, 0]], constant_values=-1)  # (B, t + n - 1)
    length = tf.shape(history)[1]
    frames = tf.gather(padded, tf.range(length)[:, None] + tf.range(n)[None, :],
                       axis=1)  # (B, t, n)
    context = padded[:, length:]  # (B, n - 1): the last n - 1 tokens
    match = tf.reduce_all(tf.equal(frames[:, :, :n - 1], context[:, None, :]), axis=-1)  # (B, t)
    rows = tf.broadcast_to(tf.range(tf.shape(history)[0])[:, None], tf.shape(history))
    indices = tf.reshape(tf.stack([rows, history], -1), [-1, 2])
    counts = tf.scatter_nd(indices, tf.reshape(tf.cast(match, tf.float32), [-1]),
                           [tf.shape(history)[0], vocab_size])
    return counts > 0


class StepRules:
    """What the options do to one search step of B rows (a sentence, or a beam's hypotheses): the
    model's log-probabilities, and those the search chooses from once the options have changed them
    (repetition penalty, minimum length, n-gram blocking) and a target prefix has forced its token.

    settings: DecodingSettings. min_lengths: (B,) int32 tokens before </s>, or None. prefix: (B, P)
    int32 target prefixes padded with 0, or None."""

    def __init__(self, settings, min_lengths=None, prefix=None):
        self.settings, self.min_lengths, self.prefix = settings, min_lengths, prefix
        if prefix is not None:  # (B,): once, outside the search's loop
            self.prefix_lengths = tf.reduce_sum(tf.cast(tf.not_equal(prefix, PAD_ID), tf.int32), 1)

    def any(self):
        """Whether a step does more than decoding_log_probs."""
        return (self.settings.reshapes_distribution() or self.settings.samples()
                or self.prefix is not None)

    def log_probs(self, logits, history, step, must_end):
        """logits: (B, V). history: (B, t) int32, the tokens output so far. must_end: (B,) bool.
        Returns the search's log-probabilities (B, V) and the model's (B, V) (decoding_log_probs),
        both float32 and NEG_INF where impossible. The options change the logits, as
        CTranslate2's do: the search's distribution is renormalized over the tokens they leave
        (and without <pad> and <s>, which are never output)."""
        settings, vocab_size = self.settings, logits.shape[-1]
        logits = tf.cast(logits, tf.float32)
        model = decoding_log_probs(logits, must_end)
        search = model
        if settings.uses("repetition_penalty"):
            logits = penalize_repetitions(logits, history, settings.repetition_penalty)
        bans = []
        if self.min_lengths is not None:  # the last step's </s> wins over the minimum
            too_short = tf.logical_and(step < self.min_lengths, tf.logical_not(must_end))
            is_eos = tf.equal(tf.range(vocab_size), EOS_ID)[None, :]  # (1, V)
            bans.append(tf.logical_and(too_short[:, None], is_eos))
        if settings.no_repeat_ngram_size:
            bans.append(repeated_ngram_bans(history, settings.no_repeat_ngram_size, vocab_size))
        if bans or settings.uses("repetition_penalty"):
            banned = tf.constant(banned_outputs(vocab_size))[None, :]  # (1, V): <pad>, <s>
            for ban in bans:
                banned = tf.logical_or(banned, ban)  # (B, V)
            search = decoding_log_probs(tf.where(banned, NEG_INF, logits), must_end)
        if self.prefix is not None:  # the prefix's token, at the model's log-probability
            forcing = step < self.prefix_lengths
            forced = tf.gather(self.prefix, tf.minimum(step, tf.shape(self.prefix)[1] - 1), axis=1)
            only_forced = tf.where(tf.equal(tf.range(vocab_size)[None, :], forced[:, None]),
                                   model, NEG_INF)
            search = tf.where(forcing[:, None], only_forced, search)
        return search, model

    def choose(self, search):
        """Each row's token: drawn (sample_tokens) when sampling, else the most probable.
        search: (B, V). Returns (B,) int32."""
        if self.settings.samples():
            return sample_tokens(search, self.settings)
        return tf.cast(tf.argmax(search, axis=-1), tf.int32)


def sample_tokens(log_probs, settings):
    """One token per row drawn from softmax(log_probs / sampling_temperature) restricted to the
    sampling_topk most probable tokens (0: all of them) and then to the nucleus, the fewest most
    probable tokens whose probability adds up to sampling_topp (Holtzman et al., 2020).
    log_probs: (B, V) float32. Reproducible under settings.seed. Returns (B,) int32."""
    vocab_size = log_probs.shape[-1]
    top = tf.reduce_max(log_probs, axis=-1, keepdims=True)
    # <= 0, so a small temperature never overflows; NEG_INF stays the floor
    logits = tf.maximum((log_probs - top) / settings.sampling_temperature, NEG_INF)
    if settings.uses("sampling_topk"):
        k = tf.convert_to_tensor(settings.sampling_topk, tf.int32)
        k = tf.where(k > 0, tf.minimum(k, vocab_size), vocab_size)
        kth = tf.gather(tf.math.top_k(logits, k).values, k - 1, axis=1)  # (B,)
        logits = tf.where(logits < kth[:, None], NEG_INF, logits)
    if settings.uses("sampling_topp"):
        probs = tf.nn.softmax(logits)
        ranked = tf.sort(probs, axis=-1, direction="DESCENDING")  # (B, V)
        # a token is in the nucleus when the tokens ranked before it hold less than p
        kept = tf.math.cumsum(ranked, axis=-1, exclusive=True) < settings.sampling_topp
        least = tf.reduce_min(tf.where(kept, ranked, 2.0), axis=-1, keepdims=True)  # (B, 1)
        logits = tf.where(probs < least, NEG_INF, logits)
    return tf.cast(tf.random.categorical(logits, 1, seed=settings.seed)[:, 0], tf.int32)


def tile_beams(tensor, beam_size):
    """(N, ...) -> (N*K, ...), each sentence repeated K times in a row."""
    tiled = tf.repeat(tensor[:, None], beam_size, axis=1)  # (N, K, ...)
    return tf.reshape(tiled, tf.concat([[-1], tf.shape(tensor)[1:]], 0))


def _state_invariants(state):
    """Shape invariants of decoder states: a cache (B, h, L, d_model/h) grows in L, and only its
    last axis is known when the graph is built."""
    def invariant(tensor):
        dims = [None] * tensor.shape.rank
        if tensor.shape.rank > 2:
            dims[-1] = tensor.shape[-1]
        return tf.TensorShape(dims)
    return tf.nest.map_structure(invariant, state)


def greedy_search(step_fn, state, max_steps, alpha, rules=None):
    """Greedy decoding (or sampling, as rules say) in one tf.while_loop that stops once every
    sentence has emitted </s>, at the latest after max(max_steps) steps.

    step_fn(tokens (N,), step, state) -> logits (N, V), new state. max_steps: (N,) int32. rules: a
    StepRules of N rows, or None (no option, no prefix).
    A sentence's last step emits </s> whatever the log-probabilities are (NaN ones would never pick
    it), so the loop never runs past the decoding cache's length.
    Returns ids (N, T) ending in </s> then 0s, scores (N,) = sum log p / length_penalty(len,
    alpha) of the log-probabilities the search chose from, and the model's own log p(ids) (N,).
    """
    n_batch = tf.shape(max_steps)[0]

    def body(step, tokens, ids, log_prob, model_log_prob, finished, state):
        logits, state = step_fn(tokens, step, state)
        with tf.name_scope("search"):
            must_end = step + 1 >= max_steps
            if rules is None or not rules.any():
                tokens, token_log_probs = greedy_choice(logits, must_end)  # (N,) each
                model_log_probs = token_log_probs
            else:
                search, model = rules.log_probs(logits, ids, step, must_end)  # (N, V) each
                tokens = rules.choose(search)
                token_log_probs = tf.gather(search, tokens, batch_dims=1)
                model_log_probs = tf.gather(model, tokens, batch_dims=1)
            tokens = tf.where(finished, PAD_ID, tokens)
            log_prob += tf.where(finished, 0.0, token_log_probs)
            model_log_prob += tf.where(finished, 0.0, model_log_probs)
        return (step + 1, tokens, tf.concat([ids, tokens[:, None]], 1), log_prob, model_log_prob,
                tf.logical_or(finished, tf.equal(tokens, EOS_ID)), state)

    def cond(step, tokens, ids, log_prob, model_log_prob, finished, state):
        return tf.logical_not(tf.reduce_all(finished))

    loop_vars = (tf.constant(0), tf.fill([n_batch], BOS_ID), tf.zeros([n_batch, 0], tf.int32),
                 tf.zeros([n_batch]), tf.zeros([n_batch]), tf.zeros([n_batch], tf.bool), state)
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None, None]),
                  tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([None]),
                  _state_invariants(state))
    _, _, ids, log_prob, model_log_prob, _, _ = tf.while_loop(
        cond, body, loop_vars, shape_invariants=invariants,
        maximum_iterations=tf.reduce_max(max_steps))
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.float32), axis=1)
    return ids, log_prob / length_penalty(lengths, alpha), model_log_prob


def beam_search(step_fn, state, max_steps, beam_size, alpha, rules=None):
    """Beam search (Section 6.1) in one tf.while_loop; finished hypotheses are kept apart from the
    live ones.

    step_fn(tokens (N*K,), step, state, parents) -> logits (N*K, V), new state; every state tensor
    is (N*K, ...), and parents (N*K,) are the rows of the state that the N*K hypotheses continue:
    step_fn reorders the state itself, as its first use of it (so that it can update the reordered
    copy in place).
    max_steps: (N,) int32. rules: a StepRules of N*K rows, or None (no option, no prefix). Each step
    extends the K live hypotheses of a sentence by every token and keeps the 2K best extensions:
    those among the top K that end in </s> compete (score = log p / length_penalty) for the K
    finished slots, the others that do not end in </s> for the K live slots (so K = 1 is greedy
    decoding). A sentence is done when its best finished score beats the best score any live
    hypothesis could still reach, or at max_steps (where only </s> is allowed); whatever the
    log-probabilities, the loop ends after max(max_steps) steps, within the decoding cache.
    Returns ids (N, K, T) and scores (N, K), best first, and the model's own log p(ids) (N, K).
    """
    n_batch, K = tf.shape(max_steps)[0], beam_size
    batch_pos = tf.range(n_batch)[:, None]  # (N, 1)

    def body(step, alive_ids, alive_log_probs, alive_model, finished_ids, finished_scores,
             finished_model, state, parents):
        logits, state = step_fn(tf.reshape(alive_ids[:, :, -1], [-1]), step, state, parents)
        with tf.name_scope("search"):
            alive, finished, parents = extend(step, alive_ids, alive_log_probs, alive_model,
                                              finished_ids, finished_scores, finished_model,
                                              logits)
        return (step + 1, *alive, *finished, state, parents)

    def step_log_probs(logits, alive_ids, step):
        """The search's and the model's log-probabilities of every extension, (N, K, V) each."""
        vocab_size = logits.shape[-1]
        if rules is None or not rules.any():
            log_probs = decoding_log_probs(tf.reshape(logits, [n_batch, K, vocab_size]),
                                           step + 1 >= max_steps)
            return log_probs, log_probs
        must_end = tile_beams(step + 1 >= max_steps, K)  # (N*K,)
        history = tf.reshape(alive_ids[:, :, 1:], [n_batch * K, -1])  # without <s>
        search, model = rules.log_probs(logits, history, step, must_end)
        return tuple(tf.reshape(t, [n_batch, K, vocab_size]) for t in (search, model))

    def extend(step, alive_ids, alive_log_probs, alive_model, finished_ids, finished_scores,
               finished_model, logits):
        """The hypotheses after one step: (alive_ids, their log-probs, their model log-probs),
        (finished_ids, their scores, their model log-probs), parents."""
        vocab_size = logits.shape[-1]
        log_probs, model = step_log_probs(logits, alive_ids, step)
        candidates = tf.reshape(alive_log_probs[:, :, None] + log_probs, [n_batch, K * vocab_size])
        top_log_probs, top_index = top_k_by_blocks(candidates, 2 * K)  # (N, 2K)
        top_model = top_log_probs if model is log_probs else tf.gather(
            tf.reshape(alive_model[:, :, None] + model, [n_batch, K * vocab_size]), top_index,
            batch_dims=1)
        origin, tokens = top_index // vocab_size, top_index % vocab_size
        # (N, 2K, t+2)
        top_ids = tf.concat([tf.gather(alive_ids, origin, batch_dims=1), tokens[:, :, None]], 2)
        ends = tf.equal(tokens, EOS_ID)

        live_scores, live = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), K)  # (N, K)
        alive = (tf.gather(top_ids, live, batch_dims=1), live_scores,
                 tf.gather(top_model, live, batch_dims=1))
        parents = tf.reshape(tf.gather(origin, live, batch_dims=1) + batch_pos * K, [-1])  # (N*K,)

        in_beam = tf.range(2 * K)[None, :] < K  # only extensions that rank in the top K may finish
        ended_scores = tf.where(tf.logical_and(ends, in_beam),
                                top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
        # (N, 3K, t+1)
        pool_ids = tf.concat([tf.pad(finished_ids, [[0, 0], [0, 0], [0, 1]]), top_ids[:, :, 1:]], 1)
        finished_scores, best = tf.math.top_k(tf.concat([finished_scores, ended_scores], 1), K)
        finished = (tf.gather(pool_ids, best, batch_dims=1), finished_scores,
                    tf.gather(tf.concat([finished_model, top_model], 1), best, batch_dims=1))
        return alive, finished, parents

    def cond(step, alive_ids, alive_log_probs, alive_model, finished_ids, finished_scores,
             finished_model, state, parents):
        best_reachable = alive_log_probs[:, 0] / length_penalty(max_steps, alpha)  # (N,)
        done = tf.logical_or(step >= max_steps, finished_scores[:, 0] >= best_reachable)
        return tf.logical_not(tf.reduce_all(done))

    # one live start
    first_live = tf.concat([tf.zeros([n_batch, 1]), tf.fill([n_batch, K - 1], NEG_INF)], 1)
    loop_vars = (tf.constant(0), tf.fill([n_batch, K, 1], BOS_ID), first_live, first_live,
                 tf.zeros([n_batch, K, 0], tf.int32), tf.fill([n_batch, K], NEG_INF),
                 tf.fill([n_batch, K], NEG_INF), state, tf.range(n_batch * K))
    beams_shape = tf.TensorShape([None, beam_size])
    invariants = (tf.TensorShape([]), tf.TensorShape([None, beam_size, None]), beams_shape,
                  beams_shape, tf.TensorShape([None, beam_size, None]), beams_shape, beams_shape,
                  _state_invariants(state), tf.TensorShape([None]))
    _, _, _, _, finished_ids, finished_scores, finished_model, _, _ = tf.while_loop(
        cond, body, loop_vars, shape_invariants=invariants,
        maximum_iterations=tf.reduce_max(max_steps))
    return finished_ids, finished_scores, finished_model


# ---------------------------------------------------------------- a model's translations
def translate(model, xs, settings, prefix=None):
    """The best translation of each sentence of a batch.

    model: model.Transformer (or an Ensemble). xs: data_load.Sources, x (N, T1). settings:
    DecodingSettings (beam_size 1: greedy, or sampling). prefix: None, or (N, P) int32 target
    prefixes padded with 0 that every translation starts with.
    Returns ids (N, T) ending in </s> then 0s, and scores (N,) =
    log p(ids) / length_penalty(len, alpha).
    """
    ids, scores, _ = search(model, xs, settings, 1, prefix)
    return ids[:, 0, :], scores[:, 0]


def nbest(model, xs, settings, n, prefix=None):
    """The n best translations of each sentence, best first: ids (N, n, T) and scores (N, n).
    model, xs, settings, prefix: as in translate (n needs a beam of n or more, or sampling)."""
    ids, scores, _ = search(model, xs, settings, n, prefix)
    return ids, scores


def search(model, xs, settings, n=1, prefix=None):
    """The n best translations of each sentence (n samples when sampling), best first: ids (N, n,
    T), scores (N, n), and the model's own log p(ids | x) (N, n), the confidence's numerator.

    model, xs, settings, prefix: as in translate. n 1 is the best (greedy under beam_size 1); more
    are the n best of beam search, and need settings.beam_size n or more, or n samples.
    """
    if settings.samples() and settings.beam_size > 1:
        raise ValueError("sampling draws one hypothesis at a time: it needs a beam of 1, not %d"
                         % settings.beam_size)
    if settings.beam_size > 1:
        if n > settings.beam_size:
            raise ValueError("the %d best translations need a beam of %d or more, not %d"
                             % (n, n, settings.beam_size))
        return tuple(t[:, :n] for t in beams(model, xs, settings, prefix))
    if n > 1 and not settings.samples():
        raise ValueError("the %d best translations need a beam of %d or more, or sampling"
                         % (n, n))
    return samples(model, xs, settings, n, prefix)


def beams(model, xs, settings, prefix=None):
    """Beam search with settings.beam_size hypotheses per sentence (1 too), each with a row of the
    cache. model, xs, settings, prefix: as in translate. Returns the finished hypotheses' ids (N, K,
    T), scores (N, K) and the model's log-probabilities (N, K), best first; a slot that no
    hypothesis filled scores NEG_INF."""
    K = settings.beam_size
    memory, src_masks, max_steps, rules = _encode(model, xs, settings, prefix, K)
    step_fn, state = model.cached_decoder(memory, src_masks)
    return beam_search(step_fn, state, max_steps, K, settings.alpha, rules)


def samples(model, xs, settings, n, prefix=None):
    """Greedy decoding (n 1) or n samples per sentence, best first: ids (N, n, T), scores (N, n)
    and the model's log-probabilities (N, n). model, xs, settings, prefix: as in translate."""
    memory, src_masks, max_steps, rules = _encode(model, xs, settings, prefix, n)
    step_fn, state = model.cached_decoder(memory, src_masks)
    if n > 1:
        max_steps = tile_beams(max_steps, n)
    found = greedy_search(step_fn, state, max_steps, settings.alpha, rules)
    ids, scores, log_probs = (tf.reshape(t, tf.concat([[-1, n], tf.shape(t)[1:]], 0))
                              for t in found)
    if n == 1:
        return ids, scores, log_probs
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
    return tuple(tf.gather(t, order, batch_dims=1) for t in (ids, scores, log_probs))


def _encode(model, xs, settings, prefix, rows):
    """The encoder's output (the memory, its padding masks) with each sentence's rows of the
    search (a beam's hypotheses, or samples), each sentence's step limit (N,), and the StepRules of
    those rows."""
    memory, src_masks = model.encode(xs, training=False)
    max_steps = max_decoding_steps(xs.x_seqlen, settings.max_len_a, settings.max_len_b)
    if prefix is not None:  # room for the prefix and </s>
        max_steps = tf.maximum(max_steps, tf.reduce_sum(
            tf.cast(tf.not_equal(prefix, PAD_ID), tf.int32), axis=1) + 1)
    min_lengths = None
    if settings.uses("min_len_a") or settings.uses("min_len_b"):
        min_lengths = min_decoding_lengths(xs.x_seqlen, settings.min_len_a, settings.min_len_b)
    if rows > 1:
        memory, src_masks, min_lengths, prefix = (
            None if t is None else tf.nest.map_structure(lambda s: tile_beams(s, rows), t)
            for t in (memory, src_masks, min_lengths, prefix))
    return memory, src_masks, max_steps, StepRules(settings, min_lengths, prefix)


class Ensemble:
    """Models of one vocabulary decoded together (any shapes): each step's log-probabilities are the
    mean of theirs, each model running its own cache. Has a model's encode and cached_decoder, which
    is all that decoding uses. scopes: per model the variable scope it was built in (None: the
    graph's root), entered around each of its calls."""

    def __init__(self, models, scopes):
        self.models, self.scopes = models, scopes

    def _in_scope(self, i):
        if self.scopes[i] is None:
            return contextlib.nullcontext()
        return tf1.variable_scope(self.scopes[i], reuse=tf1.AUTO_REUSE)

    def encode(self, xs, training=False):
        """Per model its memory (a tuple), and the source's padding masks (N, T1)."""
        encoded = []
        for i, model in enumerate(self.models):
            with self._in_scope(i):
                encoded.append(model.encode(xs, training=training))
        return tuple(memory for memory, _ in encoded), encoded[0][1]

    def cached_decoder(self, memories, src_masks):
        """step_fn(tokens, step, states, parents=None) -> the mean of the models' log-probabilities
        (B, V) and their new states; the models' empty states (a tuple)."""
        decoders = []
        for i, (model, memory) in enumerate(zip(self.models, memories)):
            with self._in_scope(i):
                decoders.append(model.cached_decoder(memory, src_masks))

        def step_fn(tokens, step, states, parents=None):
            log_probs, new_states = [], []
            for i, ((model_step, _), state) in enumerate(zip(decoders, states)):
                with self._in_scope(i):
                    logits, state = model_step(tokens, step, state, parents)
                log_probs.append(tf.nn.log_softmax(tf.cast(logits, tf.float32)))
                new_states.append(state)
            return tf.add_n(log_probs) / len(log_probs), tuple(new_states)
        return step_fn, tuple(state for _, state in decoders)


#: What a translator gives per source (toolkit.translating.translator.Translator.run, and the
#: CTranslate2 engine's): the K best ids (K, T) ending in </s> then 0s, their scores (K,), the best
#: one's cross-attention (h, T, T1) or None, and the model's log p(ids) (K,).
Translation = collections.namedtuple("Translation", "ids scores attention log_probs")


def confidence(log_prob, tokens):
    """The geometric mean of a translation's token probabilities from the model's log p of its
    tokens (</s> counted) and their count: exp(log p / tokens), 1 for no tokens. Numbers or numpy
    arrays of one shape."""
    tokens = np.asarray(tokens)
    return np.where(tokens > 0, np.exp(np.asarray(log_prob, np.float64) / np.maximum(tokens, 1)),
                    1.0)


def confidences(ids, log_probs):
    """The confidence of translations: ids numpy (..., T) ending in </s> then 0s, log_probs (...,)
    the model's log p of each."""
    return confidence(log_probs, (np.asarray(ids) != PAD_ID).sum(-1))
