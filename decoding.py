"""Decoding: a model's translations, greedy or by beam search, each batch inside one tf.while_loop
(Vaswani et al., 2017, Section 6.1: beam search with a length penalty, outputs at most a constant
longer than the input).

    settings = DecodingSettings(beam_size=4, alpha=0.6)    # or DecodingSettings.from_flags(hp)
    ids, scores = translate(model, xs, settings)           # the best: (N, T), (N,)
    ids, scores = nbest(model, xs, settings, n)            # the n best: (N, n, T), (N, n)

model is a model.Transformer; xs = data_load.Sources(x (N, T1), x_seqlen (N,)). The searches run a
step function, step_fn(tokens (B,), step, state[, parents]) -> logits (B, V), new state, that the
model builds (Transformer.cached_decoder: its decoder stack one position at a time). This module
knows logits, tokens and the cache's layout (B, h, L, d), not the model's layers; grow_cache and
write_in_place serve the fast model's cache (fast.model.FastTransformer), which grows in chunks
about as long as what was decoded and is written without copies.
"""
import dataclasses

import numpy as np
import tensorflow as tf

from toolkit.base.ids import BOS_ID, EOS_ID, PAD_ID

#: Stands in for log(0) in decoding: finite, so sums and differences never turn into NaN.
NEG_INF = -1e9


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode, with the defaults of hparams.py's flags of the same names: beam_size
    hypotheses per sentence (1: greedy decoding), the alpha of length_penalty, and at most max_len_a
    * source length + max_len_b steps per sentence (max_decoding_steps)."""
    beam_size: int = 1
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10

    @classmethod
    def from_flags(cls, hp):
        """The settings of parsed flags hp (--beam_size, --alpha, --max_len_a, --max_len_b)."""
        return cls(hp.beam_size, hp.alpha, hp.max_len_a, hp.max_len_b)


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


def greedy_search(step_fn, state, max_steps, alpha):
    """Greedy decoding in one tf.while_loop that stops once every sentence has emitted </s>, at the
    latest after max(max_steps) steps.

    step_fn(tokens (N,), step, state) -> logits (N, V), new state. max_steps: (N,) int32.
    A sentence's last step emits </s> whatever the log-probabilities are (NaN ones would never pick
    it), so the loop never runs past the decoding cache's length.
    Returns ids (N, T) ending in </s> then 0s, and scores (N,) =
    sum log p / length_penalty(len, alpha).
    """
    n_batch = tf.shape(max_steps)[0]

    def body(step, tokens, ids, log_prob, finished, state):
        logits, state = step_fn(tokens, step, state)
        with tf.name_scope("search"):
            tokens, token_log_probs = greedy_choice(logits, step + 1 >= max_steps)  # (N,) each
            tokens = tf.where(finished, PAD_ID, tokens)
            log_prob += tf.where(finished, 0.0, token_log_probs)
        return (step + 1, tokens, tf.concat([ids, tokens[:, None]], 1), log_prob,
                tf.logical_or(finished, tf.equal(tokens, EOS_ID)), state)

    def cond(step, tokens, ids, log_prob, finished, state):
        return tf.logical_not(tf.reduce_all(finished))

    loop_vars = (tf.constant(0), tf.fill([n_batch], BOS_ID), tf.zeros([n_batch, 0], tf.int32),
                 tf.zeros([n_batch]), tf.zeros([n_batch], tf.bool), state)
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None, None]),
                  tf.TensorShape([None]), tf.TensorShape([None]), _state_invariants(state))
    _, _, ids, log_prob, _, _ = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants,
                                              maximum_iterations=tf.reduce_max(max_steps))
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.float32), axis=1)
    return ids, log_prob / length_penalty(lengths, alpha)


def beam_search(step_fn, state, max_steps, beam_size, alpha):
    """Beam search (Section 6.1) in one tf.while_loop; finished hypotheses are kept apart from the
    live ones.

    step_fn(tokens (N*K,), step, state, parents) -> logits (N*K, V), new state; every state tensor
    is (N*K, ...), and parents (N*K,) are the rows of the state that the N*K hypotheses continue:
    step_fn reorders the state itself, as its first use of it (so that it can update the reordered
    copy in place).
    max_steps: (N,) int32. Each step extends the K live hypotheses of a sentence by every token and
    keeps the 2K best extensions: those among the top K that end in </s> compete (score = log p /
    length_penalty) for the K finished slots, the others that do not end in </s> for the K live
    slots (so K = 1 is greedy decoding). A sentence is done when its best finished score beats the
    best score any live hypothesis could still reach, or at max_steps (where only </s> is allowed);
    whatever the log-probabilities, the loop ends after max(max_steps) steps, within
    the decoding cache.
    Returns ids (N, K, T) and scores (N, K), best first.
    """
    n_batch, K = tf.shape(max_steps)[0], beam_size
    batch_pos = tf.range(n_batch)[:, None]  # (N, 1)

    def body(step, alive_ids, alive_log_probs, finished_ids, finished_scores, state, parents):
        logits, state = step_fn(tf.reshape(alive_ids[:, :, -1], [-1]), step, state, parents)
        with tf.name_scope("search"):
            alive_ids, alive_log_probs, finished_ids, finished_scores, parents = extend(
                step, alive_ids, alive_log_probs, finished_ids, finished_scores, logits)
        return step + 1, alive_ids, alive_log_probs, finished_ids, finished_scores, state, parents

    def extend(step, alive_ids, alive_log_probs, finished_ids, finished_scores, logits):
        """The hypotheses after one step: alive_ids, their log-probs, finished_ids,
        their scores, parents."""
        vocab_size = logits.shape[-1]
        log_probs = decoding_log_probs(tf.reshape(logits, [n_batch, K, vocab_size]),
                                       step + 1 >= max_steps)
        candidates = tf.reshape(alive_log_probs[:, :, None] + log_probs, [n_batch, K * vocab_size])
        top_log_probs, top_index = top_k_by_blocks(candidates, 2 * K)  # (N, 2K)
        origin, tokens = top_index // vocab_size, top_index % vocab_size
        # (N, 2K, t+2)
        top_ids = tf.concat([tf.gather(alive_ids, origin, batch_dims=1), tokens[:, :, None]], 2)
        ends = tf.equal(tokens, EOS_ID)

        live_scores, live = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), K)  # (N, K)
        alive_ids = tf.gather(top_ids, live, batch_dims=1)
        parents = tf.reshape(tf.gather(origin, live, batch_dims=1) + batch_pos * K, [-1])  # (N*K,)

        in_beam = tf.range(2 * K)[None, :] < K  # only extensions that rank in the top K may finish
        ended_scores = tf.where(tf.logical_and(ends, in_beam),
                                top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
        # (N, 3K, t+1)
        pool_ids = tf.concat([tf.pad(finished_ids, [[0, 0], [0, 0], [0, 1]]), top_ids[:, :, 1:]], 1)
        finished_scores, best = tf.math.top_k(tf.concat([finished_scores, ended_scores], 1), K)
        return alive_ids, live_scores, tf.gather(pool_ids, best,
                                                 batch_dims=1), finished_scores, parents

    def cond(step, alive_ids, alive_log_probs, finished_ids, finished_scores, state, parents):
        best_reachable = alive_log_probs[:, 0] / length_penalty(max_steps, alpha)  # (N,)
        done = tf.logical_or(step >= max_steps, finished_scores[:, 0] >= best_reachable)
        return tf.logical_not(tf.reduce_all(done))

    # one live start
    first_live = tf.concat([tf.zeros([n_batch, 1]), tf.fill([n_batch, K - 1], NEG_INF)], 1)
    loop_vars = (tf.constant(0), tf.fill([n_batch, K, 1], BOS_ID), first_live,
                 tf.zeros([n_batch, K, 0], tf.int32), tf.fill([n_batch, K], NEG_INF), state,
                 tf.range(n_batch * K))
    invariants = (tf.TensorShape([]), tf.TensorShape([None, beam_size, None]),
                  tf.TensorShape([None, beam_size]), tf.TensorShape([None, beam_size, None]),
                  tf.TensorShape([None, beam_size]), _state_invariants(state),
                  tf.TensorShape([None]))
    _, _, _, finished_ids, finished_scores, _, _ = tf.while_loop(
        cond, body, loop_vars, shape_invariants=invariants,
        maximum_iterations=tf.reduce_max(max_steps))
    return finished_ids, finished_scores


# ---------------------------------------------------------------- a model's translations
def translate(model, xs, settings):
    """The best translation of each sentence of a batch.

    model: model.Transformer. xs: data_load.Sources, x (N, T1). settings: DecodingSettings
    (beam_size 1: greedy).
    Returns ids (N, T) ending in </s> then 0s, and scores (N,) =
    log p(ids) / length_penalty(len, alpha).
    """
    if settings.beam_size > 1:
        ids, scores = beams(model, xs, settings)
        return ids[:, 0, :], scores[:, 0]
    memory, src_masks, max_steps = _encode(model, xs, settings)
    step_fn, state = model.cached_decoder(memory, src_masks)
    return greedy_search(step_fn, state, max_steps, settings.alpha)


def beams(model, xs, settings):
    """Beam search with settings.beam_size hypotheses per sentence (1 too), each with a row
    of the cache.

    model, xs, settings: as in translate. Returns the finished hypotheses' ids (N, K, T) and scores
    (N, K), best first; a slot that no hypothesis filled scores NEG_INF.
    """
    memory, src_masks, max_steps = _encode(model, xs, settings)
    K = settings.beam_size
    # N*K rows
    step_fn, state = model.cached_decoder(tile_beams(memory, K), tile_beams(src_masks, K))
    return beam_search(step_fn, state, max_steps, K, settings.alpha)


def nbest(model, xs, settings, n):
    """The n best translations of each sentence, best first: ids (N, n, T) and scores (N, n).

    model, xs, settings: as in translate. n 1 is translate's best (greedy under beam_size 1); more
    are the n best of beams, and need settings.beam_size n or more.
    """
    if n > settings.beam_size:
        raise ValueError("the %d best translations need a beam of %d or more, not %d"
                         % (n, n, settings.beam_size))
    if n == 1:
        ids, scores = translate(model, xs, settings)
        return ids[:, None, :], scores[:, None]
    ids, scores = beams(model, xs, settings)
    return ids[:, :n], scores[:, :n]


def _encode(model, xs, settings):
    """The encoder output (N, T1, d_model), its padding masks (N, T1) and each sentence's
    step limit (N,)."""
    memory, src_masks = model.encode(xs, training=False)
    return memory, src_masks, max_decoding_steps(xs.x_seqlen, settings.max_len_a,
                                                 settings.max_len_b)
