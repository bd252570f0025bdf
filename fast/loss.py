"""The training loss of the output layer (Section 5.4's label-smoothed cross entropy, shared output
projection of Section 3.4), computed so that no (tokens, V) tensor but the softmax itself is built:
the output logits in chunks of rows, one softmax per chunk, and the one-hot and uniform parts of the
gradient applied where they cost (tokens,) or (V,) work. modules.label_smoothing is the plain form
the tests hold this one to.
"""
import tensorflow as tf

import fast.kernels as kernels


def smoothed_cross_entropy(logits, labels, logit_means, epsilon=0.1):
    """Cross entropy against q = label_smoothing(one_hot(labels)) from one softmax, building no
    (M, V) targets.

    With p = softmax(logits), lse the log-sum-exp of a row and y its label: -sum_v q_v log p_v
    = lse - (1 - epsilon) logits[y] - epsilon mean_v(logits), and lse = logits[y] - log p_y, so the
    loss needs only p_y and the row's mean logit (which the caller gets without a pass over V: see
    output_loss). Its gradient d loss / d logits = p - (1 - epsilon) one_hot(y) - epsilon / V is
    returned as p alone: the caller applies the one-hot and uniform parts where they cost (M,) or
    (V,) work instead of (M, V). log p_y is taken of max(p_y, 1e-37): a token the model gives less
    than that has its loss capped near 85 nats (the gradient is exact).
    logits: (M, V) float32. labels: (M,) int32. logit_means: (M,) mean_v(logits) of each row.
    Returns losses (M,) and p = softmax(logits) (M, V).
    """
    probs = tf.nn.softmax(logits)  # (M, V)
    label_probs = tf.gather(probs, labels, batch_dims=1)  # (M,)
    label_logits = tf.gather(logits, labels, batch_dims=1)  # (M,)
    losses = epsilon * (label_logits - logit_means) - tf.math.log(tf.maximum(label_probs, 1e-37))
    return losses, probs


def output_loss(hidden, embeddings, labels, epsilon=0.1, dtype=tf.float32, chunk_rows=256,
                fused_kernels=False):
    """Summed smoothed_cross_entropy of the output logits hidden @ embeddings^T (Sections 3.4 and
    5.4), computed chunk_rows rows at a time together with its gradient (chunked_loss).

    hidden: (M, d_model) float32, decoder outputs of the M target tokens scored. embeddings: (V,
    d_model) float32, the output projection W. labels: (M,) int32. dtype: of the matrix products
    (bfloat16 or float16 for mixed precision). fused_kernels: with a 16-bit dtype, each chunk's
    softmax and losses in one kernel that reads the logits in dtype
    (kernels.smoothed_cross_entropy), and each chunk's embedding gradient added to the float32 sum
    in one pass (kernels.accumulate); in any dtype, the labels' rows added into that sum in place
    (kernels.scatter_add_rows). Returns the sum of the M losses, a float32 scalar.
    """
    # in float32, oneDNN's softmax is as fast without casts
    fused = fused_kernels and dtype != tf.float32

    def chunk_loss(logits, chunk_labels, logit_means):
        if fused:
            return kernels.smoothed_cross_entropy(logits, chunk_labels, logit_means, epsilon)
        losses, probs = smoothed_cross_entropy(tf.cast(logits, tf.float32), chunk_labels,
                                               logit_means, epsilon)
        return losses, tf.cast(probs, dtype)
    return chunked_loss(hidden, embeddings, labels, chunk_loss, epsilon, dtype, chunk_rows,
                        fused_kernels)


def rdrop_output_loss(hidden1, hidden2, embeddings, labels, alpha, epsilon=0.1,
                      dtype=tf.float32, chunk_rows=256, fused_kernels=False):
    """R-Drop's output-layer loss (Liang et al., 2021, Eq. 3), summed over M tokens scored twice:
    CE(p1) + CE(p2) + alpha KL_sym(p1, p2) per token, with p1 and p2 the softmax of the two
    passes' logits, CE smoothed_cross_entropy and KL_sym = (KL(p1 || p2) + KL(p2 || p1)) / 2
    (model.symmetric_kl), computed chunk_rows rows at a time like output_loss: the two passes'
    rows of a token sit side by side, so that a chunk holds both and the logits are made once.

    With l = log p, d = l1 - l2 and KL12 = KL(p1 || p2), KL21 = KL(p2 || p1), the KL term's
    gradient is d KL_sym / d logits1 = (p1 (d - KL12) + p1 - p2) / 2, and the same with the
    passes swapped for logits2; it joins the softmax part of the cross entropy's gradient.
    hidden1, hidden2: (M, d_model) float32, the two passes' decoder outputs. labels: (M,) int32.
    alpha: a Python float. chunk_rows: even. The rest as in output_loss (here the softmax is always
    TensorFlow's, in float32). Returns the sum, a float32 scalar.
    """
    d_model = hidden1.shape[-1]
    # (2M, d_model): token i's passes in rows 2i and 2i + 1
    pairs = tf.reshape(tf.stack([hidden1, hidden2], axis=1), [-1, d_model])

    def chunk_loss(logits, chunk_labels, logit_means):  # logits: (chunk_rows, V)
        logits = tf.cast(logits, tf.float32)
        losses, probs = smoothed_cross_entropy(logits, chunk_labels, logit_means, epsilon)
        vocab_size = logits.shape[-1]
        log_probs = tf.reshape(tf.nn.log_softmax(logits), [-1, 2, vocab_size])  # (pairs, 2, V)
        probs = tf.reshape(probs, [-1, 2, vocab_size])
        d = log_probs[:, 0] - log_probs[:, 1]  # (pairs, V)
        kl12 = tf.reduce_sum(probs[:, 0] * d, axis=-1, keepdims=True)  # (pairs, 1)
        kl21 = -tf.reduce_sum(probs[:, 1] * d, axis=-1, keepdims=True)
        difference = probs[:, 0] - probs[:, 1]
        kl_grads = tf.stack([probs[:, 0] * (d - kl12) + difference,
                             probs[:, 1] * (-d - kl21) - difference], axis=1) / 2  # (pairs, 2, V)
        # the pair's KL term on its first row
        kl = tf.stack([(kl12 + kl21)[:, 0] / 2, tf.zeros_like(kl12[:, 0])], axis=1)  # (pairs, 2)
        grads = tf.reshape(probs + alpha * kl_grads, [-1, vocab_size])
        return losses + alpha * tf.reshape(kl, [-1]), tf.cast(grads, dtype)
    return chunked_loss(pairs, embeddings, tf.repeat(labels, 2), chunk_loss, epsilon, dtype,
                        chunk_rows, fused_kernels)


def chunked_loss(hidden, embeddings, labels, chunk_loss, epsilon, dtype, chunk_rows,
                 fused_kernels):
    """The sum of chunk_loss's losses over the output logits hidden @ embeddings^T, computed
    chunk_rows rows at a time together with its gradient.

    The (M, V) logits and their softmax are a training step's largest tensors. Here at most
    (chunk_rows, V) of them exist at once: chunk_loss(logits (chunk_rows, V) in dtype, labels,
    logit means) returns the chunk's losses (chunk_rows,) float32 and the part of their gradient
    d losses / d logits that is not the smoothed one-hot target's (for the cross entropy, p) in
    dtype, which is multiplied into the gradients of hidden and embeddings in the forward pass; the
    backward pass only scales those by the upstream gradient. The target's part, -(1 - epsilon)
    one_hot(y) - epsilon / V, is added to those gradients directly: -(1 - epsilon) W_y - epsilon
    mean_v(W_v) for each row of hidden, and -(1 - epsilon) h_i to row y_i of the embeddings'
    gradient for every token i, -epsilon / V sum_i h_i to each of its rows. Each row's mean logit
    is h_i . mean_v(W_v). The rows are padded with zeros to a multiple of chunk_rows, so every
    chunk has one shape whatever M is (oneDNN builds kernels per shape); zero rows add nothing to
    the embeddings' gradient and their losses are left out of the sum.
    fused_kernels: with a 16-bit dtype, each chunk's embedding gradient added to the float32 sum in
    one pass (kernels.accumulate); in any dtype, the labels' rows added into that sum in place
    (kernels.scatter_add_rows). Returns a float32 scalar.
    """
    d_model = hidden.shape[-1]
    accumulate = fused_kernels and dtype != tf.float32
    rows = tf.shape(hidden)[0]
    padding = -rows % chunk_rows
    real_rows = tf.range(rows + padding) < rows  # (M + padding,)
    labels = tf.pad(labels, [[0, padding]])

    @tf.custom_gradient
    def loss_sum(hidden, embeddings):  # hidden: (M + padding, d_model)
        weights = tf.cast(embeddings, dtype)  # (V, d_model)
        mean_embedding = tf.reduce_mean(embeddings, axis=0)  # (d_model,)
        logit_means = tf.linalg.matvec(hidden, mean_embedding)  # (M + padding,)

        # losses, hidden_grads: one entry per chunk
        def body(start, losses, hidden_grads, embedding_grads):
            chunk = tf.cast(hidden[start:start + chunk_rows], dtype)  # (chunk_rows, d_model)
            logits = tf.matmul(chunk, weights, transpose_b=True)  # (chunk_rows, V) in dtype
            chunk_losses, logit_grads = chunk_loss(logits, labels[start:start + chunk_rows],
                                                   logit_means[start:start + chunk_rows])
            # (chunk_rows, d_model)
            chunk_grads = tf.cast(tf.matmul(logit_grads, weights), tf.float32)
            product = tf.matmul(logit_grads, chunk, transpose_a=True)  # (V, d_model) in dtype
            embedding_grads = (kernels.accumulate(embedding_grads, product) if accumulate
                               else embedding_grads + tf.cast(product, tf.float32))
            index = start // chunk_rows
            return (start + chunk_rows, losses.write(index, chunk_losses),
                    hidden_grads.write(index, chunk_grads), embedding_grads)

        chunks = tf.shape(hidden)[0] // chunk_rows
        losses = tf.TensorArray(tf.float32, size=chunks, element_shape=[chunk_rows])
        hidden_grads = tf.TensorArray(tf.float32, size=chunks, element_shape=[chunk_rows, d_model])
        # (d_model,), added to every row
        uniform = -epsilon / embeddings.shape[0] * tf.reduce_sum(hidden, axis=0)
        # with the kernels, the sum starts from the uniform part instead of adding it after the loop
        initial_grads = (tf.broadcast_to(uniform, tf.shape(embeddings)) if fused_kernels
                         else tf.zeros_like(embeddings))
        _, losses, hidden_grads, embedding_grads = tf.while_loop(
            lambda start, *_: start < rows, body,
            [tf.constant(0), losses, hidden_grads, initial_grads],
            parallel_iterations=1)  # one chunk at a time
        total = tf.reduce_sum(tf.where(real_rows, losses.concat(), 0.0))
        hidden_grads = (hidden_grads.concat() - (1 - epsilon) * tf.gather(embeddings, labels)
                        - epsilon * mean_embedding)  # (M + padding, d_model)
        if fused_kernels:  # each token's row added to its label's row in place
            embedding_grads = kernels.scatter_add_rows(embedding_grads, labels, hidden,
                                                       -(1 - epsilon))
        else:
            embedding_grads = tf.tensor_scatter_nd_sub(embedding_grads + uniform, labels[:, None],
                                                       (1 - epsilon) * hidden)  # (V, d_model)
        return total, lambda upstream: (upstream * hidden_grads, upstream * embedding_grads)
    return loss_sum(tf.pad(hidden, [[0, padding], [0, 0]]), embeddings)
