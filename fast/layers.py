"""Building blocks of the Transformer (Vaswani et al., 2017, "Attention Is All You Need") as
pure graph functions.

Every function takes tensors and returns tensors; variables are created with
`tf.compat.v1.get_variable` under the given scope and reused on a second call in the same scope
(AUTO_REUSE), so the training, evaluation and decoding graphs share one set of weights. Nothing here
writes summaries, touches files or keeps globals.

Shapes: N batch, T_q / T_k query / key lengths, d_model hidden size, h heads, V vocabulary size.
"""
import tensorflow as tf

from fast.kernels import attention_softmax_dropout, dropout_seed, residual_dropout_ln
from fast.kernels import merge_heads as merge_heads_kernel, split_heads as split_heads_kernel
from modules import MASKED_LOGIT

tf1 = tf.compat.v1


def dense_variables(d_in, units, scope="dense"):
    """The variables of a dense layer: `scope/kernel` (d_in, units) and `scope/bias` (units,)."""
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        kernel = tf1.get_variable("kernel", [d_in, units],
                                  initializer=tf1.glorot_uniform_initializer())
        bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    return kernel, bias


#: The gradient that bias_add gives BiasAdd ops in bfloat16 (see bias_column_sums).
BF16_BIAS_GRADIENT = "BiasAddColumnSums"


@tf.RegisterGradient(BF16_BIAS_GRADIENT)
def bias_column_sums(op, grad):
    """BiasAdd's gradient, the bias's part computed as ones (1, rows) @ grad (rows, units): a matrix
    product sums in float32. TensorFlow's BiasAddGrad sums bfloat16 in bfloat16, whose 8-bit
    significand stops growing once the sum is 256 times an addend (4,096 rows of 1 sum to 256), so
    the biases' gradients came out too small; the product is also the faster of the two on CPUs with
    bfloat16 units. grad: (rows, units)."""
    ones = tf.ones([1, tf.shape(grad)[0]], grad.dtype)
    return grad, tf.reshape(tf.matmul(ones, grad), [-1])  # (rows, units), (units,)


def bias_add(rows, bias):
    """rows (rows, units) + bias (units,), as a BiasAdd op (oneDNN fuses it into the product before
    it; its gradient is one op), whose bias gradient sums in float32 in every dtype
    (bias_column_sums for bfloat16)."""
    if rows.dtype != tf.bfloat16:
        return tf.nn.bias_add(rows, bias)
    with tf1.get_default_graph().gradient_override_map({"BiasAdd": BF16_BIAS_GRADIENT}):
        return tf.nn.bias_add(rows, bias)


def affine(inputs, kernel, bias, dtype=tf.float32):
    """inputs @ kernel + bias over the last axis. inputs: (..., d_in), any float dtype. kernel:
    (d_in, units). bias: (units,). dtype: of the product and the outputs (kernel and bias are cast
    to it). Returns (..., units)."""
    d_in, units = kernel.shape[0], kernel.shape[1]
    rows = inputs if inputs.shape.rank == 2 else tf.reshape(inputs, [-1, d_in])  # (N*T, d_in)
    # (N*T, units)
    outputs = bias_add(tf.matmul(tf.cast(rows, dtype), tf.cast(kernel, dtype)),
                       tf.cast(bias, dtype))
    # no reshapes: the decoding loop runs on (N, d_model) rows, a few ops count there
    if inputs.shape.rank == 2:
        return outputs
    return tf.reshape(outputs, tf.concat([tf.shape(inputs)[:-1], [units]], 0))  # (..., units)


def dense(inputs, units, scope="dense", dtype=tf.float32):
    """Affine map of the last axis (Keras 3 removed tf.compat.v1.layers.dense; this replaces it).

    inputs: (..., d_in), any float dtype. dtype: of the product and the outputs (bfloat16 or float16
    for mixed precision: the variables stay float32 and are cast). Returns (..., units) in dtype.
    Variables `scope/kernel` (d_in, units) and `scope/bias` (units,).
    """
    return affine(inputs, *dense_variables(inputs.shape[-1], units, scope), dtype)


def fused_dense_variables(d_in, units, scopes):
    """The variables of the dense layers `scopes` (each (d_in, units)) concatenated along their
    outputs, so that one matrix product computes all of them: kernel (d_in, len(scopes) * units),
    bias (len(scopes) * units,). The variables keep their own names; the gradient of the
    concatenation splits back into them."""
    kernels, biases = zip(*(dense_variables(d_in, units, scope) for scope in scopes))
    # stacked on a new middle axis: the layout of a concatenation along axis 1, which TensorFlow
    # copies a row piece at a time (2-3x slower for 256 x 256 kernels)
    # (d_in, P, units) -> (d_in, P*units)
    kernel = tf.reshape(tf.stack(kernels, axis=1), [d_in, len(scopes) * units])
    return kernel, tf.concat(biases, axis=0)


def fused_heads(inputs, units, scopes, num_heads, dtype=tf.float32, fused_kernels=False):
    """The dense layers `scopes` on the same inputs (N, T, d_in) as one matrix product
    (fused_dense_variables), each output split into heads (split_heads) by one transpose for all of
    them. fused_kernels: by one kernel instead (kernels.split_heads, the same copy; its gradient is
    one copy too, where TensorFlow's stacks the parts' gradients and transposes them back).

    Returns a list of len(scopes) tensors (N*h, T, units/h) in dtype.
    """
    kernel, bias = fused_dense_variables(inputs.shape[-1], units, scopes)
    outputs = affine(inputs, kernel, bias, dtype)  # (N, T, P*units), P = len(scopes)
    if fused_kernels:
        return split_heads_kernel(outputs, num_heads, len(scopes))
    n_batch, length, parts = tf.shape(inputs)[0], tf.shape(inputs)[1], len(scopes)
    # (N, T, P, h, units/h)
    heads = tf.reshape(outputs, [n_batch, length, parts, num_heads, units // num_heads])
    heads = tf.transpose(heads, [2, 0, 3, 1, 4])  # (P, N, h, T, units/h)
    # unstacking the outer axis shares the transposed buffer instead of copying parts of it
    # P x (N*h, T, units/h)
    return tf.unstack(tf.reshape(heads, [parts, -1, length, units // num_heads]))


def dropout(inputs, rate, training):
    """Inverted dropout (Section 5.4), active only when `training` (a Python bool) is True and
    rate > 0.

    inputs: any shape. Returns the same shape: each entry zeroed with probability `rate` (rounded to
    a multiple of 2^-16), the others scaled by 1 / (1 - rate). The keep decisions are 16-bit random
    numbers, four per 64-bit random word, half the random bits of tf.nn.dropout's one float per
    entry (docs/log/performance-log.md has the measurement). The words come from a stateless
    generator seeded from the graph's random stream, so tf1.set_random_seed still makes
    runs repeatable.
    """
    if not training or rate == 0:
        return inputs
    size = tf.size(inputs)
    seed = dropout_seed()
    words = tf.random.stateless_uniform([(size + 3) // 4], seed, minval=None, maxval=None,
                                        dtype=tf.uint64)
    # (4 * words,) uniform over [-2^15, 2^15)
    draws = tf.reshape(tf.bitcast(words, tf.int16), [-1])[:size]
    keep = tf.reshape(draws, tf.shape(inputs)) >= int(round(rate * 2 ** 16)) - 2 ** 15
    # the backward pass keeps bools
    return tf.where(keep, inputs * (1 / (1 - rate)), tf.zeros([], inputs.dtype))


def ln(inputs, epsilon=1e-6, scope="ln"):
    """Layer normalization (Ba et al., 2016) over the last axis, with learned gain `gamma`
    and bias `beta`.
    inputs: (..., d_model). Returns (..., d_model). The gradient is written out (normalize_rows);
    modules.ln is the same function left to automatic differentiation, which the tests hold
    this one to.
    """
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        gamma, beta = ln_variables(inputs.shape[-1])
        return normalize_rows(inputs, gamma, beta, epsilon)


def ln_variables(d_model):
    """The gain `gamma` (d_model,), initially 1, and bias `beta` (d_model,), initially 0, in the
    current scope."""
    gamma = tf1.get_variable("gamma", [d_model], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("beta", [d_model], initializer=tf1.zeros_initializer())
    return gamma, beta


def normalize_rows(inputs, gamma, beta, epsilon):
    """gamma * (x - mean(x)) / sqrt(var(x) + epsilon) + beta over the last axis, with the gradient
    written out.

    inputs: (..., d). gamma, beta: (d,). Returns (..., d). With x_hat the normalized rows,
    r = 1/sqrt(var + eps) and g the incoming gradient, the input's gradient is
    r * (G - mean(G) - x_hat * mean(G * x_hat)), G = g * gamma (per row, over the last axis);
    gamma's is sum(g * x_hat) and beta's sum(g) over all rows. That is about half the elementwise
    passes of differentiating the moments, subtraction and scaling one by one.
    """
    @tf.custom_gradient
    def forward(x, gain, bias):
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)  # (..., 1) each
        rstd = tf.math.rsqrt(variance + epsilon)  # (..., 1)
        x_hat = (x - mean) * rstd  # (..., d)

        def gradient(g):
            g_gain = g * gain
            mean_g = tf.reduce_mean(g_gain, -1, keepdims=True)  # (..., 1)
            mean_gx = tf.reduce_mean(g_gain * x_hat, -1, keepdims=True)  # (..., 1)
            dx = (g_gain - mean_g - x_hat * mean_gx) * rstd  # (..., d)
            rows = list(range(g.shape.rank - 1))  # every axis but the last
            return dx, tf.reduce_sum(g * x_hat, rows), tf.reduce_sum(g, rows)

        return x_hat * gain + bias, gradient

    return forward(inputs, gamma, beta)


def mask_keys(inputs, key_masks):
    """Gives padded keys the attention logit MASKED_LOGIT (Section 3.2.3) by adding biases: a masked
    key's softmax weight is exactly 0, and unlike selecting through a mask, the addition passes the
    gradient through unchanged.

    inputs: (N*h, T_q, T_k) logits, each sentence's h heads next to each other on the first axis.
    key_masks: (N, T_k) bool, True at padded key positions (made from token ids: tf.equal(x, 0)); or
    (N*h, 1, T_k) or (1, 1, T_k) float32 biases, MASKED_LOGIT at the masked keys and 0 elsewhere
    (key_biases), one row per logit row (or one for all), which the decoding loop makes once per
    batch or step.
    Returns (N*h, T_q, T_k).
    """
    if key_masks.shape.rank == 2:
        key_masks = head_biases(key_masks, tf.shape(inputs)[0] // tf.shape(key_masks)[0])
    return inputs + tf.cast(key_masks, inputs.dtype)


def key_biases(key_masks):
    """Bool masks (any shape), True at the keys not to attend to -> float32 biases for mask_keys."""
    return tf.where(key_masks, MASKED_LOGIT, 0.0)


def head_biases(key_masks, num_heads):
    """key_masks: (N, T_k) bool, True at padding -> (N*h, 1, T_k) float32 biases for mask_keys, one
    row per head: made once per batch, they serve every layer that attends over those keys."""
    return key_biases(tf.repeat(key_masks, num_heads, axis=0)[:, None, :])


def mask_future(inputs):
    """Gives keys later than their query the attention logit MASKED_LOGIT (Section 3.2.3, the
    decoder's self-attention), by adding biases as mask_keys does. inputs: (N, T_q, T_k) logits.
    Returns (N, T_q, T_k)."""
    # (T_q, T_k): key <= query
    allowed = tf.linalg.band_part(tf.ones_like(inputs[0, :, :]), -1, 0) > 0
    return inputs + tf.cast(key_biases(tf.logical_not(allowed)), inputs.dtype)[None, :, :]


def scaled_dot_product_attention(Q, K, V, key_masks, causality=False, dropout_rate=0.,
                                 training=True, fused_kernels=False):
    """softmax(Q K^T / sqrt(d_k)) V (Section 3.2.1).

    Q: (N, T_q, d_k). K: (N, T_k, d_k). V: (N, T_k, d_v); all float32, or all bfloat16 / float16 for
    mixed precision, in which case the products run in that dtype and the scaling, masks and softmax
    in float32.
    key_masks: (N', T_k) bool with N a multiple of N' (heads stacked on the batch axis),
        (N or 1, 1, T_k) float32 biases, or None (see mask_keys).
    causality: if True, query t attends only to keys <= t.
    fused_kernels: in training, the scaling, masks, softmax and dropout, and their gradient, run as
        one kernel each (kernels.attention_softmax_dropout: the same function, with keep decisions
        of its own).
    Returns outputs (N, T_q, d_v) in V's dtype and attention weights (N, T_q, T_k) float32.
    """
    d_k = Q.shape[-1]
    scores = tf.matmul(Q, K, transpose_b=True)  # (N, T_q, T_k) in Q's dtype
    if fused_kernels and training:
        attention, dropped = attention_softmax_dropout(scores, attention_biases(key_masks, scores),
                                                       float(d_k) ** -0.5, causality, dropout_rate)
        return tf.matmul(dropped, V), attention
    logits = tf.cast(scores, tf.float32) * (float(d_k) ** -0.5)
    if key_masks is not None:
        logits = mask_keys(logits, key_masks)
    if causality:
        logits = mask_future(logits)
    attention = tf.nn.softmax(logits)
    # (N, T_q, d_v)
    outputs = tf.matmul(dropout(tf.cast(attention, V.dtype), dropout_rate, training), V)
    return outputs, attention


def attention_biases(key_masks, scores):
    """key_masks as mask_keys takes them -> (N or 1, 1, T_k) float32 biases for scores (N, T_q, T_k)
    (zeros for None)."""
    if key_masks is None:
        return tf.zeros([1, 1, tf.shape(scores)[2]])
    if key_masks.shape.rank == 2:
        return head_biases(key_masks, tf.shape(scores)[0] // tf.shape(key_masks)[0])
    return key_masks


def split_heads(x, num_heads, fused_kernels=False):
    """(N, T, d_model) -> (N*h, T, d_model/h): each sentence's heads next to each other on
    the batch axis.
    fused_kernels: by kernels.split_heads (the same copy) instead of a transpose."""
    if fused_kernels:
        return split_heads_kernel(x, num_heads)[0]
    n_batch, length, d_model = tf.shape(x)[0], tf.shape(x)[1], x.shape[-1]
    # (N, T, h, d_model/h)
    heads = tf.reshape(x, [n_batch, length, num_heads, d_model // num_heads])
    # (N*h, T, d_model/h)
    return tf.reshape(tf.transpose(heads, [0, 2, 1, 3]), [-1, length, d_model // num_heads])


def merge_heads(x, num_heads, fused_kernels=False):
    """(N*h, T, d_model/h) -> (N, T, d_model); the inverse of split_heads. fused_kernels:
    by kernels.merge_heads."""
    if fused_kernels:
        return merge_heads_kernel([x], num_heads)
    length, d_head = tf.shape(x)[1], x.shape[-1]
    heads = tf.reshape(x, [-1, num_heads, length, d_head])  # (N, h, T, d_model/h)
    # (N, T, d_model)
    return tf.reshape(tf.transpose(heads, [0, 2, 1, 3]), [-1, length, num_heads * d_head])


def attention_heads(Q, K, V, key_masks, num_heads, causality=False, dropout_rate=0., training=True,
                    fused_kernels=False):
    """Attention of every head at once (Section 3.2.2), on projected queries, keys and values split
    into heads.

    Q: (N*h, T_q, d_model/h). K, V: (N*h, T_k, d_model/h), float32 or 16-bit. key_masks: (N, T_k)
    bool or None.
    fused_kernels: as for scaled_dot_product_attention.
    Returns outputs (N, T_q, d_model) in V's dtype (heads concatenated, before the output
    projection) and attention weights (N, h, T_q, T_k) float32.
    """
    outputs, attention = scaled_dot_product_attention(Q, K, V, key_masks, causality, dropout_rate,
                                                      training, fused_kernels)
    t_q, t_k = tf.shape(Q)[1], tf.shape(K)[1]
    outputs = merge_heads(outputs, num_heads, fused_kernels and training)  # (N, T_q, d_model)
    return outputs, tf.reshape(attention, [-1, num_heads, t_q, t_k])  # (N, h, T_q, T_k)


def sublayer_input(inputs, norm_type):
    """What a sublayer sees: LN(x) for pre-layer-norm blocks (Xiong et al., 2020), x itself for
    post-layer-norm (Section 3.1).

    inputs: (N, T, d_model). Returns (N, T, d_model). Uses the variables of scope `ln` in the
    current scope.
    """
    return ln(inputs) if norm_type == "pre" else inputs


def sublayer_output(inputs, outputs, norm_type, dropout_rate, training):
    """Residual connection around a sublayer: LN(x + dropout(f)) (post, Section 3.1) or x +
    dropout(f) (pre, Xiong et al., 2020), with dropout on f (Section 5.4).

    inputs: (N, T, d_model) float32, the sublayer's input x. outputs: (N, T, d_model), the
    sublayer's f, in float32 or a 16-bit float (dropped out in its own dtype, then added in
    float32). Returns (N, T, d_model) float32.
    """
    residual = inputs + tf.cast(dropout(outputs, dropout_rate, training), inputs.dtype)
    return ln(residual) if norm_type == "post" else residual


def projected_sublayer_output(inputs, hidden, scope, norm_type, dropout_rate, training, dtype,
                              fused_kernels=False):
    """A sublayer's last dense layer `scope`, f = hidden W + b, then its residual connection and
    layer norm (sublayer_output).

    inputs: (N, T, d_model) float32, the sublayer's input x. hidden: (N, T, d_in), or (N*T, d_in)
    rows, what the last dense layer maps to d_model. dtype: of its product (as for dense).
    fused_kernels: in training with post-norm, LN(x + dropout(f)) and its gradient run as one kernel
    each, b added in the kernel rather than after the product, so that the backward kernel also sums
    b's gradient (kernels.residual_dropout_ln: the same function, with keep decisions of its own).
    Returns inputs' shape, float32.
    """
    kernel, bias = dense_variables(hidden.shape[-1], inputs.shape[-1], scope)
    if fused_kernels and training and norm_type == "post":
        # (N*T, d_in)
        rows = hidden if hidden.shape.rank == 2 else tf.reshape(hidden, [-1, hidden.shape[-1]])
        # (N, T, d)
        product = tf.reshape(tf.matmul(tf.cast(rows, dtype), tf.cast(kernel, dtype)),
                             tf.shape(inputs))
        with tf1.variable_scope("ln", reuse=tf1.AUTO_REUSE):
            gamma, beta = ln_variables(inputs.shape[-1])
            return residual_dropout_ln(inputs, product, bias, gamma, beta, dropout_rate)
    outputs = affine(hidden, kernel, bias, dtype)
    if outputs.shape.rank != inputs.shape.rank:
        outputs = tf.reshape(outputs, tf.shape(inputs))  # (N, T, d_model)
    return sublayer_output(inputs, outputs, norm_type, dropout_rate, training)


def attention_sublayer_output(queries, Q, K, V, key_masks, num_heads, causality, dropout_rate,
                              training, norm_type, dtype, fused_kernels=False,
                              attention_dropout=0.):
    """The part of an attention sublayer after the projections: the heads' attention, the output
    projection `o` (in the current variable scope), the residual connection and layer norm (Sections
    3.2.2 and 3.1).

    queries: (N, T_q, d_model) float32, the sublayer's input x. Q: (N*h, T_q, d_model/h). K, V:
    (N*h, T_k, d_model/h), split into heads. key_masks: (N, T_k) bool or None.
    fused_kernels: as for self_attention.
    dropout_rate: on the sublayer's output; attention_dropout: on the attention weights.
    Returns outputs (N, T_q, d_model) float32 and attention (N, h, T_q, T_k).
    """
    outputs, attention = attention_heads(Q, K, V, key_masks, num_heads, causality,
                                         attention_dropout, training,
                                         fused_kernels)  # outputs: (N, T_q, d_model)
    return projected_sublayer_output(queries, outputs, "o", norm_type, dropout_rate, training,
                                     dtype, fused_kernels), attention


def self_attention(inputs, key_masks, num_heads=8, dropout_rate=0., training=True, causality=False,
                   scope="self_attention", norm_type="post", dtype=tf.float32, fused_kernels=False,
                   attention_dropout=0.):
    """Multi-head self-attention sublayer with residual connection and layer norm (Sections 3.2.2
    and 3.1; pre-norm: Xiong et al., 2020): queries, keys and values are all projected from the
    sublayer's input x (LN(inputs) for norm_type "pre"), by one matrix product over the q, k and v
    kernels side by side.

    inputs: (N, T, d_model). key_masks: (N, T) bool, True at padding; None attends to every key.
    causality: if True, position t attends only to positions <= t.
    dropout_rate: on the sublayer's output, before the residual add; attention_dropout: on the
    attention weights.
    dtype: of the projections and the attention products (bfloat16 or float16 for mixed precision:
        Q, K, V and the heads' outputs stay in it from one product to the next; softmax, residual
        and layer norm are float32).
    fused_kernels: while training, the attention's softmax and dropout in one kernel, the residual
        connection and layer norm in another (scaled_dot_product_attention,
        projected_sublayer_output), and the heads split and merged by one copy each
        (fused_heads, merge_heads).
    Variables: `scope/{q,k,v,o}/{kernel,bias}` and `scope/ln/{gamma,beta}`.
    Returns outputs (N, T, d_model) and attention weights (N, h, T, T).
    """
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        x = sublayer_input(inputs, norm_type)
        Q, K, V = fused_heads(x, inputs.shape[-1], ("q", "k", "v"), num_heads, dtype,
                              fused_kernels and training)  # each (N*h, T, d_model/h)
        return attention_sublayer_output(inputs, Q, K, V, key_masks, num_heads, causality,
                                         dropout_rate, training, norm_type, dtype, fused_kernels,
                                         attention_dropout)


def cross_attention(queries, memory, key_masks, num_heads=8, dropout_rate=0., training=True,
                    scope="vanilla_attention", norm_type="post", dtype=tf.float32,
                    fused_kernels=False, attention_dropout=0.):
    """Multi-head attention of the decoder over the encoder's output, with residual connection and
    layer norm (Sections 3.2.2 and 3.2.3): queries are projected from the sublayer's input x
    (LN(queries) for norm_type "pre"), keys and values from memory, by one matrix product over the k
    and v kernels side by side.

    queries: (N, T_q, d_model). memory: (N, T_k, d_model), the encoder's output.
    key_masks: (N, T_k) bool, True at padding. dropout_rate, attention_dropout, dtype,
    fused_kernels: as for self_attention.
    Variables: `scope/{q,k,v,o}/{kernel,bias}` and `scope/ln/{gamma,beta}`.
    Returns outputs (N, T_q, d_model) and attention weights (N, h, T_q, T_k).
    """
    d_model = queries.shape[-1]
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        x = sublayer_input(queries, norm_type)
        fused = fused_kernels and training
        # (N*h, T_q, d_model/h)
        Q = split_heads(dense(x, d_model, scope="q", dtype=dtype), num_heads, fused)
        # each (N*h, T_k, d_model/h)
        K, V = fused_heads(memory, d_model, ("k", "v"), num_heads, dtype, fused)
        return attention_sublayer_output(queries, Q, K, V, key_masks, num_heads, False,
                                         dropout_rate, training, norm_type, dtype, fused_kernels,
                                         attention_dropout)


def ff(inputs, num_units, scope="positionwise_feedforward", dropout_rate=0., training=True,
       norm_type="post", dtype=tf.float32, fused_kernels=False, relu_dropout=0.):
    """Position-wise feed-forward sublayer max(0, x W1 + b1) W2 + b2 (Section 3.3) with residual and
    layer norm (Section 3.1).

    inputs: (N, T, d_model). num_units: [d_ff, d_model]. dtype: of the matrix products and of the
    (N, T, d_ff) hidden activations between them.
    fused_kernels: as for self_attention (projected_sublayer_output).
    dropout_rate: on the sublayer's output, before the residual add; relu_dropout: on the hidden
    activations (tensor2tensor's relu_dropout; the paper has none).
    Variables: `scope/inner/*`, `scope/outer/*`, `scope/ln/*`. Returns (N, T, d_model).
    """
    with tf1.variable_scope(scope, reuse=tf1.AUTO_REUSE):
        x = sublayer_input(inputs, norm_type)
        rows = x if x.shape.rank == 2 else tf.reshape(x, [-1, x.shape[-1]])  # (N*T, d_model)
        # the ReLU right after the product and its bias (no reshape between), so oneDNN runs the
        # three as one op
        hidden = tf.nn.relu(dense(rows, num_units[0], scope="inner", dtype=dtype))  # (N*T, d_ff)
        hidden = dropout(hidden, relu_dropout, training)
        return projected_sublayer_output(inputs, hidden, "outer", norm_type, dropout_rate, training,
                                         dtype, fused_kernels)
