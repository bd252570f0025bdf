"""The Transformer's building blocks (Vaswani et al., 2017, "Attention Is All You Need"), one
function per piece of the paper, on plain TensorFlow ops differentiated automatically. Read top to
bottom, they are the paper's Section 3.

Every function takes tensors and returns tensors; variables are made with
`tf.compat.v1.get_variable` under the given scope and reused on a second call in the same scope
(AUTO_REUSE), so the training, evaluation and decoding graphs share one set of weights. Nothing here
writes summaries, touches files or keeps globals. The fast path of the same functions (fused
products, custom gradients, C++ kernels) is fast/layers.py; the two make the same variables under
the same names.

Shapes: N batch, T_q / T_k query / key lengths, d_model hidden size, h heads, d_k = d_model / h,
V vocabulary.
"""
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

#: Logit given to masked attention positions: exp() of it is 0 in float32.
MASKED_LOGIT = -1e9


# ---------------------------------------------------------------- helpers
def dense(inputs, units, scope="dense"):
    """inputs @ kernel + bias over the last axis. inputs: (..., d_in). Returns (..., units).
    Variables `scope/kernel` (d_in, units) and `scope/bias` (units,)."""
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        kernel = tf1.get_variable("kernel", [inputs.shape[-1], units],
                                  initializer=tf1.glorot_uniform_initializer())
        bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    return tf.tensordot(inputs, kernel, axes=1) + bias


def dropout(inputs, rate, training):
    """Dropout (Section 5.4): in training, each entry zeroed with probability `rate`, the others
    scaled by 1 / (1 - rate); otherwise inputs unchanged. training: a Python bool."""
    return tf.nn.dropout(inputs, rate=rate) if training and rate > 0 else inputs


def get_token_embeddings(vocab_size, num_units, zero_pad=True):
    """The shared token embedding matrix (Section 3.4), variable `shared_weight_matrix/weight_mat`.

    vocab_size: V. num_units: d_model. zero_pad: if True, row 0 (the id of <pad>) is a
    constant zero vector.
    Returns (V, d_model), initialized from N(0, d_model^-0.5) so that embeddings * sqrt(d_model)
    have unit scale.
    """
    with tf1.variable_scope("shared_weight_matrix", reuse=tf1.AUTO_REUSE):
        embeddings = tf1.get_variable(
            "weight_mat", [vocab_size, num_units],
            initializer=tf1.random_normal_initializer(0.0, num_units ** -0.5))
        # times a constant (V, 1) column of [0, 1, 1, ...]: cheaper to differentiate than a slice
        if zero_pad:
            embeddings = embeddings * np.concatenate([[[0.0]],
                                                      np.ones([vocab_size - 1,
                                                               1])]).astype(np.float32)
    return embeddings


def split_heads(x, num_heads):
    """(N, T, d_model) -> (N, h, T, d_k): the last axis cut into h heads (Section 3.2.2)."""
    n_batch, length, d_model = tf.shape(x)[0], tf.shape(x)[1], x.shape[-1]
    return tf.transpose(tf.reshape(x, [n_batch, length, num_heads, d_model // num_heads]),
                        [0, 2, 1, 3])


def merge_heads(x):
    """(N, h, T, d_k) -> (N, T, h * d_k): the heads concatenated again, the
    inverse of split_heads."""
    n_batch, num_heads, length, d_k = tf.shape(x)[0], x.shape[1], tf.shape(x)[2], x.shape[-1]
    return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [n_batch, length, num_heads * d_k])


# ---------------------------------------------------------------- Section 3.1: layer normalization
def ln(inputs, epsilon=1e-6, scope="ln"):
    """Layer normalization (Ba et al., 2016) over the last axis, with learned gain `gamma` and bias
    `beta`: gamma * (x - mean(x)) / sqrt(var(x) + epsilon) + beta.

    inputs: (..., d_model). Returns (..., d_model). Variables `scope/gamma` (ones) and
    `scope/beta` (zeros).
    """
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        gamma = tf1.get_variable("gamma", [inputs.shape[-1]], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [inputs.shape[-1]], initializer=tf1.zeros_initializer())
    mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)  # (..., 1) each
    return gamma * (inputs - mean) * tf.math.rsqrt(variance + epsilon) + beta


# ---------------------------------------------------------------- Section 3.2: attention
def mask(scores, key_masks=None, causality=False):
    """Hides keys from queries (Section 3.2.3) by giving their logits MASKED_LOGIT, whose softmax
    weight is 0.

    scores: (N, h, T_q, T_k) logits. key_masks: (N, T_k) bool, True at padded keys, or None.
    causality: if True, query t sees only keys <= t (the decoder's self-attention:
    no peeking ahead).
    Returns (N, h, T_q, T_k).
    """
    if key_masks is not None:
        # (N, 1, 1, T_k) broadcast
        scores += tf.where(key_masks, MASKED_LOGIT, 0.0)[:, None, None, :]
    if causality:
        t_q, t_k = tf.shape(scores)[2], tf.shape(scores)[3]
        future = tf.range(t_k)[None, :] > tf.range(t_q)[:, None]  # (T_q, T_k): key after query
        scores += tf.where(future, MASKED_LOGIT, 0.0)
    return scores


def scaled_dot_product_attention(Q, K, V, key_masks=None, causality=False, dropout_rate=0.,
                                 training=True):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Section 3.2.1), with
    dropout on the weights.

    Q: (N, h, T_q, d_k). K: (N, h, T_k, d_k). V: (N, h, T_k, d_v).
    key_masks, causality: as for mask.
    Returns outputs (N, h, T_q, d_v) and attention weights (N, h, T_q, T_k).
    """
    d_k = Q.shape[-1]
    scores = tf.matmul(Q, K, transpose_b=True) / d_k ** 0.5  # (N, h, T_q, T_k)
    attention = tf.nn.softmax(mask(scores, key_masks, causality))
    return tf.matmul(dropout(attention, dropout_rate, training), V), attention


def multihead_attention(queries, keys_values, key_masks, num_heads=8, dropout_rate=0.,
                        training=True, causality=False, scope="multihead_attention",
                        norm_type="post", attention_dropout=0., cache=None):
    """Multi-head attention (Section 3.2.2) as a sublayer: MultiHead(Q, K, V) = Concat(head_1, ...,
    head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), then dropout, the residual
    connection and layer norm (Section 3.1: LN(x + Sublayer(x)); with norm_type "pre", x +
    Sublayer(LN(x)), Xiong et al., 2020).

    queries: (N, T_q, d_model), the sublayer's input x.
    keys_values: (N, T_k, d_model), the encoder's output for the decoder's attention over it
        (Section 3.2.3), or None for self-attention (keys and values come from x itself).
    key_masks: (N, T_k) bool, True at padded keys, or None. causality: as for mask.
    dropout_rate: on the sublayer's output (Section 5.4); attention_dropout: on
    the attention weights.
    cache: for decoding one position at a time, a dict {"keys", "values"} of the self-attention keys
        and values of the positions before, each (N, h, t, d_k); this position's are appended to it
        (the dict is updated).
    Variables: `scope/{q,k,v,o}/{kernel,bias}` and `scope/ln/{gamma,beta}`.
    Returns outputs (N, T_q, d_model) and attention weights (N, h, T_q, T_k).
    """
    d_model = queries.shape[-1]
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        x = ln(queries) if norm_type == "pre" else queries
        source = x if keys_values is None else keys_values
        Q = split_heads(dense(x, d_model, "q"), num_heads)  # (N, h, T_q, d_k)
        K = split_heads(dense(source, d_model, "k"), num_heads)  # (N, h, T_k, d_k)
        V = split_heads(dense(source, d_model, "v"), num_heads)  # (N, h, T_k, d_k)
        if cache is not None:
            K = cache["keys"] = tf.concat([cache["keys"], K], axis=2)  # (N, h, t + 1, d_k)
            V = cache["values"] = tf.concat([cache["values"], V], axis=2)
        outputs, attention = scaled_dot_product_attention(Q, K, V, key_masks, causality,
                                                          attention_dropout, training)
        outputs = dense(merge_heads(outputs), d_model, "o")  # (N, T_q, d_model)
        outputs = queries + dropout(outputs, dropout_rate, training)  # residual connection
        return (ln(outputs) if norm_type == "post" else outputs), attention


# ---------------------------------------------------------- Section 3.3: position-wise feed-forward
def ff(inputs, num_units, scope="positionwise_feedforward", dropout_rate=0., training=True,
       norm_type="post", relu_dropout=0.):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Section 3.3) as a sublayer, with dropout, the residual
    connection and layer norm as in multihead_attention.

    inputs: (N, T, d_model). num_units: [d_ff, d_model]. relu_dropout: on the hidden activations
    (tensor2tensor's; the paper has none). Variables: `scope/inner/*`, `scope/outer/*`,
    `scope/ln/*`. Returns (N, T, d_model).
    """
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        x = ln(inputs) if norm_type == "pre" else inputs
        # (N, T, d_ff)
        hidden = dropout(tf.nn.relu(dense(x, num_units[0], "inner")), relu_dropout, training)
        outputs = inputs + dropout(dense(hidden, num_units[1], "outer"), dropout_rate, training)
        return ln(outputs) if norm_type == "post" else outputs


# ---------------------------------------------------------------- Section 3.5: positional encoding
def positional_encoding(inputs, start=0):
    """Sinusoidal positional encoding (Section 3.5), computed for the actual length, so
    any length works.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    inputs: (N, T, d_model); only its length T and width are used. start: position of the first step
    (a Python int or scalar tensor; incremental decoding passes the current step).
    Returns (1, T, d_model), which broadcasts over the batch.
    """
    d_model = inputs.shape[-1]
    length = tf.shape(inputs)[1]
    positions = tf.cast(tf.range(length) + start, tf.float32)[:, None]  # (T, 1)
    exponents = 2.0 * (np.arange(d_model) // 2) / d_model  # (d_model,)
    angles = positions * tf.constant(np.power(10000.0, -exponents), tf.float32)  # (T, d_model)
    is_even = tf.constant(np.arange(d_model) % 2 == 0)
    return tf.where(is_even, tf.sin(angles), tf.cos(angles))[None, :, :]


# ---------------------------------------------------------------- Section 5: training
def label_smoothing(inputs, epsilon=0.1):
    """Label smoothing (Section 5.4): (1 - epsilon) * one_hot + epsilon / V.

    inputs: (..., V) one-hot rows. Returns (..., V).
    """
    vocab_size = tf.cast(tf.shape(inputs)[-1], inputs.dtype)
    return (1.0 - epsilon) * inputs + epsilon / vocab_size


def noam_scheme(init_lr, global_step, warmup_steps=4000.):
    """Learning rate of Section 5.3, scaled so that it peaks at `init_lr` at `warmup_steps`.

    lr(step) = init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5): linear warm-up, then
    step^-0.5 decay.
    global_step: scalar tensor (int or float); step 0 is treated as step 1.
    Returns a scalar float32 tensor.
    """
    step = tf.maximum(tf.cast(global_step, tf.float32), 1.0)
    warmup_steps = float(warmup_steps)
    return init_lr * warmup_steps ** 0.5 * tf.minimum(step * warmup_steps ** -1.5, step ** -0.5)


def noam_cooldown_scheme(peak_lr, global_step, warmup_steps, total_steps, cooldown_fraction=0.2):
    """Noam's rate (noam_scheme) for a known training budget: it follows Section 5.3 until the last
    cooldown_fraction of the budget, then falls linearly to 0 at total_steps (the
    warm-up/decay/cooldown shape of Zhai et al., 2022; Hägele et al., 2024 find a 20% cooldown as
    good as a cosine over the whole budget).

    lr(step) = noam(step)                                             for step < start =
                                                                      (1 - cooldown) * total
               noam(start) * (total - step) / (total - start)         after, reaching 0 at total
    global_step: scalar tensor; step 0 is treated as step 1. total_steps: scalar tensor (int or
    float); 0 means not known yet, and the rate is Noam's. Returns a scalar float32 tensor.
    """
    step = tf.maximum(tf.cast(global_step, tf.float32), 1.0)
    total = tf.cast(total_steps, tf.float32)
    start = tf.maximum((1.0 - cooldown_fraction) * total, 1.0)
    cooldown = tf.clip_by_value((total - step) / tf.maximum(total - start, 1.0), 0.0, 1.0)
    cooled = noam_scheme(peak_lr, tf.minimum(step, start), warmup_steps) * cooldown
    return tf.where(total > 0, cooled, noam_scheme(peak_lr, step, warmup_steps))


def warmup_decay_scheme(peak_lr, global_step, warmup_steps, total_steps, decay="linear"):
    """Learning rate for a known training budget: linear warm-up to peak_lr at warmup_steps, then
    decay to 0 at total_steps, linearly or along a half cosine (Loshchilov and Hutter, 2017).

    lr(step) = peak_lr * step / warmup                               for step < warmup
               peak_lr * f((step - warmup) / (total - warmup))      after, with f(p) = 1 - p
                                                                     (linear) or (1 + cos(pi p)) / 2
                                                                     (cosine), p clipped to [0, 1]
    global_step: scalar tensor; step 0 is treated as step 1. total_steps: scalar tensor (int or
    float), the step at which the rate reaches 0; 0 means not known yet (a time budget before its
    step rate is measured), and the rate holds at peak_lr after warm-up.
    Returns a scalar float32 tensor.
    """
    step = tf.maximum(tf.cast(global_step, tf.float32), 1.0)
    total = tf.cast(total_steps, tf.float32)
    warmup_steps = float(max(warmup_steps, 1))
    progress = tf.clip_by_value((step - warmup_steps) / tf.maximum(total - warmup_steps, 1.0), 0.0,
                                1.0)
    factor = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + tf.cos(np.pi * progress))
    factor = tf.where(total > 0, factor, 1.0)
    return peak_lr * tf.minimum(step / warmup_steps, 1.0) * factor
