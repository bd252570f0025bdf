"""FastTransformer: model.Transformer computed by the fast path (fast/layers.py, fast/loss.py,
fast/kernels.py), for --impl fast. It makes the same variables under the same names, so checkpoints
move freely between the two, and it keeps Transformer's train, eval, score and attention, which call
the methods it overrides:

  - encode / decode / loss: the stacks of fast.layers in the compute dtype of --precision, and the
    output layer's loss in chunks of rows (fast.loss.output_loss), with no (tokens, V) logits;
  - with --kernels fused, the embedding and its dropout in one kernel and the shared embedding's
    gradients summed in place (tied_embeddings), and Adam's update in one pass
    per variable (optimizer);
  - cached_decoder: the decoder one position at a time over a cache of keys and values that grows in
    chunks and is written in place (decoding.grow_cache, write_in_place), with the memory's keys and
    values projected once.
"""
import tensorflow as tf

from decoding import grow_cache, write_in_place
from fast.kernels import OnePassAdam, embedding_dropout, scatter_add_rows
from fast.layers import (affine, cross_attention, dense, dropout, ff, fused_dense_variables,
                         fused_heads, head_biases, key_biases, ln, scaled_dot_product_attention,
                         self_attention, sublayer_input, sublayer_output)
from fast.loss import output_loss, rdrop_output_loss
from model import Transformer, twice
from modules import get_token_embeddings, positional_encoding
from toolkit.base.ids import PAD_ID

tf1 = tf.compat.v1

#: dtype of the matrix products and of the activations between them, for each --precision.
COMPUTE_DTYPES = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}


def tied_embeddings(embeddings):
    """The shared embedding matrix (Section 3.4) under two names: one for the output projection, one
    for the embedding lookups of both stacks, with the gradients of both
    summed by kernels.scatter_add_rows.

    Left to TensorFlow, each lookup's gradient (the rows of its ids) becomes a dense (V, d_model)
    tensor and the three are added: three passes over (V, d_model) more. Here the lookups' rows are
    added into the output projection's dense gradient in place. embeddings: (V, d_model) float32.
    Returns (projection, lookups), each equal to embeddings.
    """
    @tf.custom_gradient
    def tie(table):
        def gradient(d_projection, d_lookups):
            # the rows of the ids looked up, (K, d_model)
            if isinstance(d_lookups, tf.IndexedSlices):
                return scatter_add_rows(d_projection, d_lookups.indices, d_lookups.values)
            return d_projection + d_lookups
        return (tf.identity(table), tf.identity(table)), gradient
    return tie(embeddings)


class FastTransformer(Transformer):
    """model.Transformer on the fast path: the same variables, the same functions, fewer
    passes over memory."""

    def __init__(self, config):  # Transformer.__init__'s embedding, tied here
        self.config = config  # a ModelConfig
        #: dtype of the matrix products; variables, layer norm, softmax and the loss stay float32.
        self.dtype = COMPUTE_DTYPES[config.precision]
        self.fused_kernels = config.kernels == "fused"
        # (V, d_model)
        embeddings = get_token_embeddings(config.vocab_size, config.d_model, zero_pad=True)
        #: the output projection's name for the embedding matrix, and the lookups' (the same tensor
        #: without the fused kernels; with them, two names whose gradients tied_embeddings sums)
        self.embeddings, self.lookup_table = (tied_embeddings(embeddings) if self.fused_kernels
                                              else (embeddings, embeddings))

    # ---------------------------------------------------------------- encoder and decoder stacks
    def _embed(self, ids, training, start=0):
        """ids: (N, T) int32. Returns dropout(embeddings * sqrt(d_model) + positional encoding), (N,
        T, d_model) (in training with the fused kernels, in one kernel:
        kernels.embedding_dropout)."""
        embedded = tf.nn.embedding_lookup(self.lookup_table, ids)  # (N, T, d_model)
        encodings = positional_encoding(embedded, start)  # (1, T, d_model)
        scale, rate = self.config.d_model ** 0.5, self.config.dropout_rate
        if self.fused_kernels and training and rate > 0:
            return embedding_dropout(embedded, encodings[0], scale, rate)
        return dropout(embedded * scale + encodings, rate, training)

    def _final_ln(self, outputs):
        """Pre-layer-norm stacks end with one more layer norm; post-layer-norm ones
        are normalized already."""
        return ln(outputs, scope="final_ln") if self.config.norm_type == "pre" else outputs

    def encode(self, xs, training=True):
        """xs: data_load.Sources, x (N, T1).

        Returns memory (N, T1, d_model) and src_masks (N, T1) bool, True at padding.
        """
        cfg = self.config
        x = xs.x
        src_masks = tf.equal(x, PAD_ID)
        src_biases = head_biases(src_masks, cfg.num_heads)  # (N*h, 1, T1), shared by every block
        with tf1.variable_scope("encoder", reuse=tf1.AUTO_REUSE):
            enc = self._embed(x, training)
            for i in range(cfg.num_blocks):
                with tf1.variable_scope("num_blocks_{}".format(i)):
                    enc, _ = self_attention(enc, src_biases, cfg.num_heads, cfg.dropout_rate,
                                            training, scope="multihead_attention",
                                            norm_type=cfg.norm_type, dtype=self.dtype,
                                            fused_kernels=self.fused_kernels,
                                            attention_dropout=cfg.attention_dropout)
                    enc = self._feed_forward(enc, training)
            memory = self._final_ln(enc)
        return memory, src_masks

    def _feed_forward(self, inputs, training):
        """A block's position-wise feed-forward sublayer (Section 3.3, fast.layers.ff) on inputs
        (N, T, d_model)."""
        cfg = self.config
        return ff(inputs, [cfg.d_ff, cfg.d_model], dropout_rate=cfg.dropout_rate, training=training,
                  norm_type=cfg.norm_type, dtype=self.dtype, fused_kernels=self.fused_kernels,
                  relu_dropout=cfg.relu_dropout)

    def _decoder_stack(self, decoder_input, memory, src_masks, training):
        """decoder_input: (N, T2) ids. memory: (N, T1, d_model). src_masks: (N, T1).

        Returns decoder outputs (N, T2, d_model) and the last block's cross-attention (N, h, T2,
        T1). The causal mask alone hides target padding: it only ever follows the real tokens.
        """
        cfg = self.config
        src_biases = head_biases(src_masks, cfg.num_heads)  # (N*h, 1, T1), shared by every block
        with tf1.variable_scope("decoder", reuse=tf1.AUTO_REUSE):
            dec = self._embed(decoder_input, training)
            for i in range(cfg.num_blocks):
                with tf1.variable_scope("num_blocks_{}".format(i)):
                    dec, _ = self_attention(dec, None, cfg.num_heads, cfg.dropout_rate, training,
                                            causality=True, scope="self_attention",
                                            norm_type=cfg.norm_type, dtype=self.dtype,
                                            fused_kernels=self.fused_kernels,
                                            attention_dropout=cfg.attention_dropout)
                    dec, attention = cross_attention(dec, memory, src_biases, cfg.num_heads,
                                                     cfg.dropout_rate, training,
                                                     scope="vanilla_attention",
                                                     norm_type=cfg.norm_type, dtype=self.dtype,
                                                     fused_kernels=self.fused_kernels,
                                                     attention_dropout=cfg.attention_dropout)
                    dec = self._feed_forward(dec, training)
            return self._final_ln(dec), attention

    @staticmethod
    def optimizer(config, lr):
        """Adam as toolkit.training.step.make_optimizer asks for it: with --kernels fused each
        variable's update is one kernel (fast.kernels.OnePassAdam: the same update, bit for bit)."""
        adam = OnePassAdam if config.kernels == "fused" else tf1.train.AdamOptimizer
        return adam(lr, beta1=0.9, beta2=0.98, epsilon=1e-9)

    def _output_kernel(self):
        """The output projection's kernel (d_model, V) in the compute dtype: the transposed
        embedding matrix, made once per batch outside a decoding loop (a product with a kernel laid
        out (d_model, V) runs faster than one that transposes its operand on the fly)."""
        return tf.transpose(tf.cast(self.embeddings, self.dtype))

    def _logits(self, dec, kernel=None):
        """dec: (N, T, d_model) or (N, d_model). kernel: _output_kernel(), or None to make it here.
        Returns (N, T, V) or (N, V) in self.dtype (16-bit under bf16/fp16: the loss and the decoding
        log-probabilities cast to float32 themselves)."""
        with tf.name_scope("output_projection"):
            kernel = self._output_kernel() if kernel is None else kernel
            # (N*T, d_model)
            rows = dec if dec.shape.rank == 2 else tf.reshape(dec, [-1, self.config.d_model])
            logits = tf.matmul(tf.cast(rows, self.dtype), kernel)  # (N*T, V)
            if dec.shape.rank == 2:
                return logits
            return tf.reshape(logits, tf.concat([tf.shape(dec)[:-1], [self.config.vocab_size]], 0))

    def decode(self, ys, memory, src_masks, training=True):
        """ys: data_load.Targets, decoder_input and y (N, T2). memory: (N, T1, d_model).

        Returns logits (N, T2, V), greedy ids y_hat (N, T2), y, and the last block's
        cross-attention (N, h, T2, T1).
        """
        decoder_input, y, _ = ys
        dec, attention = self._decoder_stack(decoder_input, memory, src_masks, training)
        logits = self._logits(dec)
        y_hat = tf.cast(tf.argmax(logits, axis=-1), tf.int32)
        return logits, y_hat, y, attention

    # ---------------------------------------------------------------- training
    def loss(self, xs, ys):
        """Label-smoothed cross entropy summed over the non-pad target tokens, their count, and the
        last block's cross-attention (N, h, T2, T1). loss_sum / token_count is the per-token
        training loss. Logits are computed for the non-pad tokens only, a chunk of rows at
        a time (loss.output_loss). With config.rdrop > 0 it is R-Drop's loss (rdrop_loss)."""
        if self.config.rdrop:
            return self.rdrop_loss(xs, ys)
        memory, src_masks = self.encode(xs)
        decoder_input, y, _ = ys
        # (N, T2, d_model)
        dec, attention = self._decoder_stack(decoder_input, memory, src_masks, training=True)
        nonpadding = tf.not_equal(y, PAD_ID)  # (N, T2)
        # (M, d_model): M non-pad tokens
        loss_sum = output_loss(tf.boolean_mask(dec, nonpadding), self.embeddings,
                               tf.boolean_mask(y, nonpadding), self.config.smoothing, self.dtype,
                               fused_kernels=self.fused_kernels)
        return loss_sum, tf.reduce_sum(tf.cast(nonpadding, tf.float32)), attention

    def rdrop_loss(self, xs, ys):
        """R-Drop as model.Transformer.rdrop_loss states it (the paper's loss halved): the 2N rows
        in one pass, and the two passes' cross entropy and symmetric KL summed over their M
        non-pad tokens by loss.rdrop_output_loss, which makes each token's two rows of logits once,
        a chunk of rows at a time, then halved. Returns the summed loss, the M tokens (counted
        once) and the first pass's cross-attention (N, h, T2, T1)."""
        n = tf.shape(ys.y)[0]
        memory, src_masks = self.encode(twice(xs))
        # (2N, T2, d_model)
        dec, attention = self._decoder_stack(twice(ys).decoder_input, memory, src_masks,
                                             training=True)
        nonpadding = tf.not_equal(ys.y, PAD_ID)  # (N, T2): the same in both passes
        loss_sum = rdrop_output_loss(tf.boolean_mask(dec[:n], nonpadding),
                                     tf.boolean_mask(dec[n:], nonpadding), self.embeddings,
                                     tf.boolean_mask(ys.y, nonpadding), self.config.rdrop,
                                     self.config.smoothing, self.dtype,
                                     fused_kernels=self.fused_kernels)
        return loss_sum / 2, tf.reduce_sum(tf.cast(nonpadding, tf.float32)), attention[:n]

    # ------------------------------------------------------ one position at a time, for decoding.py
    def _project_memory(self, memory):
        """Cross-attention keys and values of every decoder block, computed and split into heads
        once per batch.

        memory: (B, T1, d_model). Returns a list of num_blocks pairs (K, V), each
        (B*h, T1, d_model/h).
        """
        projections = []
        with tf1.variable_scope("decoder", reuse=True):
            for i in range(self.config.num_blocks):
                with tf1.variable_scope("num_blocks_{}/vanilla_attention".format(i)):
                    projections.append(fused_heads(memory, self.config.d_model, ("k", "v"),
                                                   self.config.num_heads,
                                                   self.dtype))  # K, V: each (B*h, T1, d_model/h)
        return projections

    def _self_attention_kernels(self):
        """Each decoder block's q, k and v kernels side by side, (d_model, 3 d_model), and biases
        (3 d_model,), in the compute dtype: concatenated and cast once per batch, outside the
        decoding loop."""
        kernels = []
        with tf1.variable_scope("decoder", reuse=True):
            for i in range(self.config.num_blocks):
                with tf1.variable_scope("num_blocks_{}/self_attention".format(i)):
                    kernel, bias = fused_dense_variables(self.config.d_model, self.config.d_model,
                                                         ("q", "k", "v"))
                    kernels.append((tf.cast(kernel, self.dtype), tf.cast(bias, self.dtype)))
        return kernels

    def _one_query_attention(self, queries, Q, K, V, key_masks):
        """The rest of an attention sublayer (scope: the current one) for one query
        position per row.

        queries: (B, d_model), the sublayer's input. Q: (B, d_model), projected.
        K, V: (B*h, T_k, d_model/h).
        key_masks: (B*h, 1, T_k) or (1, 1, T_k) float32 biases of fast.layers.key_biases.
        Returns (B, d_model).
        """
        cfg = self.config
        d_head = cfg.d_model // cfg.num_heads
        # (B*h, 1, d_model/h): one position, so no transpose is needed
        Q = tf.reshape(Q, [-1, 1, d_head])
        # (B*h, 1, d_model/h)
        outputs, _ = scaled_dot_product_attention(Q, K, V, key_masks, training=False)
        outputs = dense(tf.reshape(outputs, [-1, cfg.d_model]), cfg.d_model, scope="o",
                        dtype=self.dtype)
        return sublayer_output(queries, outputs, cfg.norm_type, 0.0, False)

    def _cached_self_attention(self, dec, step, K, V, parents, qkv_kernel, rows, future):
        """Self-attention of position `step` over the cache, which it first extends by
        its own key and value.

        dec: (B, d_model). K, V: (B, h, L, d_model/h), the cache (L > step). parents: (B,) the rows
        of the cache each row continues (beam search's reordering), or None.
        qkv_kernel: (kernel, bias) of _self_attention_kernels.
        rows: (B*h,) the row of position `step` of each (sentence, head) in the cache seen as
        (B*h*L, d_model/h).
        future: (1, 1, L) float32 biases of fast.layers.key_biases, masking the
        positions after `step`.
        Returns (B, d_model) and the new cache K, V.
        """
        cfg = self.config
        d_head = cfg.d_model // cfg.num_heads
        x = sublayer_input(dec, cfg.norm_type)
        # each (B, d_model)
        Q, new_K, new_V = tf.split(affine(x, *qkv_kernel, dtype=self.dtype), 3, axis=-1)
        if parents is not None:
            with tf.name_scope("beam_reorder"):  # the copy the write below then updates in place
                K, V = tf.gather(K, parents), tf.gather(V, parents)
        with tf.name_scope("cache_write"):
            # rows (B*h, d_model/h)
            K, V = (write_in_place(cache, rows, tf.reshape(new, [-1, d_head]))
                    for cache, new in ((K, new_K), (V, new_V)))
        cache_len = tf.shape(K)[2]
        # (B*h, L, d_model/h)
        heads_K, heads_V = (tf.reshape(t, [-1, cache_len, d_head]) for t in (K, V))
        return self._one_query_attention(dec, Q, heads_K, heads_V, future), K, V

    def _cached_step(self, tokens, step, cache, parents, qkv_kernels, memory_kv, src_masks,
                     output_kernel):
        """Runs the decoder on ONE new position, reusing the self-attention keys/values
        of earlier steps.

        tokens: (B,) the previous output ids (or <s>). step: scalar int32, their position.
        cache: list of num_blocks pairs (K, V), each (B, h, L, d_model/h), the self-attention keys
            and values of positions 0..step-1 and zeros after (sentence-major, so that beam search
            can reorder them by sentence). L is a multiple of CACHE_CHUNK: the cache grows by
            CACHE_CHUNK positions when a step reaches its end (grow_cache), so attention reads about
            as many positions as were decoded, and each shape serves CACHE_CHUNK steps.
        parents: (B,) int32, the cache rows the B rows continue (beam search), or None
            (greedy: row i continues i).
        qkv_kernels: _self_attention_kernels(). memory_kv: list of num_blocks pairs (K, V), each
            (B*h, T1, d_model/h). src_masks: (B*h, 1, T1) biases (fast.layers.key_biases).
        output_kernel: _output_kernel().
        Returns logits (B, V) and the cache with position `step` written, each
        (B, h, L', d_model/h).
        """
        cfg = self.config
        cache = grow_cache(cache, step)
        cache_len = tf.shape(cache[0][0])[2]
        rows = tf.range(tf.shape(tokens)[0] * cfg.num_heads) * cache_len + step  # (B*h,)
        # (1, 1, L): keys not written yet
        future = key_biases(tf.range(cache_len)[None, None, :] > step)
        new_cache = []
        with tf1.variable_scope("decoder", reuse=True):
            # one position per row: (B, d_model) from here on, so the products need no reshapes
            dec = tf.reshape(self._embed(tokens[:, None], training=False, start=step),
                             [-1, cfg.d_model])
            for i, ((K, V), (mem_K, mem_V)) in enumerate(zip(cache, memory_kv)):
                with tf1.variable_scope("num_blocks_{}".format(i)):
                    with tf1.variable_scope("self_attention", reuse=True):
                        dec, K, V = self._cached_self_attention(dec, step, K, V, parents,
                                                                qkv_kernels[i], rows, future)
                    new_cache.append((K, V))
                    with tf1.variable_scope("vanilla_attention", reuse=True):
                        Q = dense(sublayer_input(dec, cfg.norm_type), cfg.d_model, scope="q",
                                  dtype=self.dtype)
                        dec = self._one_query_attention(dec, Q, mem_K, mem_V, src_masks)
                    dec = ff(dec, [cfg.d_ff, cfg.d_model], training=False, norm_type=cfg.norm_type,
                             dtype=self.dtype)
            dec = self._final_ln(dec)
        return self._logits(dec, output_kernel), new_cache

    def cached_decoder(self, memory, src_masks):
        """Step function and initial state for decoding with a cache (decoding.greedy_search and
        beam_search run it).

        memory: (B, T1, d_model). src_masks: (B, T1). Returns step_fn(tokens (B,), step, state,
        parents=None) -> logits (B, V), new state (see _cached_step), and the empty cache.
        """
        cfg = self.config
        memory_kv = self._project_memory(memory)
        qkv_kernels = self._self_attention_kernels()
        head_masks = head_biases(src_masks, cfg.num_heads)  # (B*h, 1, T1)
        empty = tf.zeros([tf.shape(memory)[0], cfg.num_heads, 0, cfg.d_model // cfg.num_heads],
                         self.dtype)
        cache = [(empty, empty) for _ in range(cfg.num_blocks)]  # each (B, h, 0, d_model/h)
        output_kernel = self._output_kernel()

        def step_fn(tokens, step, state, parents=None):
            return self._cached_step(tokens, step, state, parents, qkv_kernels, memory_kv,
                                     head_masks, output_kernel)
        return step_fn, cache

