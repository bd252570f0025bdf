"""The Transformer (Vaswani et al., 2017) composed from modules.py as TF1 graph builders.

    model = fast.build_transformer(ModelConfig.from_flags(hp))
        # --impl: Transformer, or fast.model.FastTransformer
    memory, src_masks = model.encode(xs)                     # (N, T1, d_model), (N, T1)
    logits, y_hat, y, attention = model.decode(ys, memory, src_masks)
    loss, grads_and_vars, attention = model.train(xs, ys, optimizer, token_count)
    ids, scores, summaries = model.eval(xs, settings)
        # dev translations (decoding.translate), a summary

xs = data_load.Sources(x, x_seqlen): x (N, T1) int32 source ids ending in </s>, padded with 0;
x_seqlen (N,) counts </s>. ys = data_load.Targets(decoder_input, y, y_seqlen):
decoder_input (N, T2) = <s> + target ids, y (N, T2) = target ids + </s>. Decoding itself (greedy
and beam search) is decoding.py's; the model gives it cached_decoder, its decoder one position at a
time over a cache of the positions before.

Two implementations compute the same function with the same variables (--impl): this Transformer,
the paper on plain TensorFlow ops, and fast.model.FastTransformer, which overrides encode, decode,
loss and cached_decoder with fused products, custom gradients and C++ kernels (fast/). Their
checkpoints are interchangeable.

Variable names (stable across versions, so checkpoints restore; see docs/checkpoint-format.md):
  shared_weight_matrix/weight_mat          (V, d_model) embeddings = output projection
  encoder/num_blocks_{i}/multihead_attention/{q,k,v,o}/{kernel,bias}, .../ln/{gamma,beta}
  encoder/num_blocks_{i}/positionwise_feedforward/{inner,outer}/{kernel,bias}, .../ln/{gamma,beta}
  decoder/num_blocks_{i}/{self_attention,vanilla_attention,positionwise_feedforward}/...
  {encoder,decoder}/final_ln/{gamma,beta}  (norm_type pre only)
"""
import dataclasses

import tensorflow as tf

from decoding import decoding_log_probs, length_penalty, translate
from hparams import MODEL_DEFAULTS
from modules import (dropout, ff, get_token_embeddings, label_smoothing, ln, multihead_attention,
                     positional_encoding)
# for the modules that import them from here
from toolkit.base.ids import BOS_ID, EOS_ID, PAD_ID  # noqa: F401

tf1 = tf.compat.v1

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What the model computes: its shape, its regularisation, its precision and implementation;
    made once from the flags and never changed (decoding settings are decoding.DecodingSettings,
    training settings stay with train.py)."""
    vocab_size: int        # V: one joint BPE vocabulary
    precision: str         # fast only: "fp32", "bf16" or "fp16", the dtype of the matrix products
    # fast only: "fused" runs training's softmax, layer norms and loss as C++ kernels
    kernels: str
    # the defaults of the flags (hparams.MODEL_DEFAULTS)
    d_model: int = MODEL_DEFAULTS["d_model"]        # width of every layer (Section 3)
    # inner width of the feed-forward sublayers (Section 3.3)
    d_ff: int = MODEL_DEFAULTS["d_ff"]
    num_blocks: int = MODEL_DEFAULTS["num_blocks"]  # blocks of the encoder, and of the decoder
    num_heads: int = MODEL_DEFAULTS["num_heads"]    # h (Section 3.2.2); d_model is a multiple of it
    # P_drop (Section 5.4): on the embeddings and on every sublayer's output
    dropout_rate: float = MODEL_DEFAULTS["dropout_rate"]
    # on the attention weights (the paper's base model: P_drop there too)
    attention_dropout: float = MODEL_DEFAULTS["dropout_rate"]
    # on the feed-forward sublayers' inner activations (none in the paper)
    relu_dropout: float = MODEL_DEFAULTS["relu_dropout"]
    # where layer norm sits: "post" (the paper) or "pre"
    norm_type: str = MODEL_DEFAULTS["norm_type"]
    smoothing: float = MODEL_DEFAULTS["smoothing"]  # label smoothing epsilon (Section 5.4)
    # "reference": this module's Transformer; "fast": fast.model's
    impl: str = MODEL_DEFAULTS["impl"]
    # R-Drop's alpha (Liang et al., 2021; Transformer.loss): 0 is off, the loss as without it
    rdrop: float = 0.0

    @classmethod
    def from_flags(cls, hp):
        """The config of resolved flags hp (hparams.py; precision already resolved, not "auto"). An
        attention_dropout of None (not given, or a model trained before the flag
        existed) is dropout_rate."""
        values = {field.name: getattr(hp, field.name) for field in dataclasses.fields(cls)}
        if values["attention_dropout"] is None:
            values["attention_dropout"] = values["dropout_rate"]
        return cls(**values)


class Transformer:
    """Encoder-decoder Transformer with one embedding matrix shared by source, target and output
    projection (Section 3.4), computed in float32."""

    def __init__(self, config):
        self.config = config  # a ModelConfig
        # (V, d_model)
        self.embeddings = get_token_embeddings(config.vocab_size, config.d_model, zero_pad=True)

    @staticmethod
    def optimizer(config, lr):
        """Adam with beta1 0.9, beta2 0.98, epsilon 1e-9 (Section 5.3) at the learning rate lr."""
        del config  # the fast path's optimizer depends on it
        return tf1.train.AdamOptimizer(lr, beta1=0.9, beta2=0.98, epsilon=1e-9)

    def embed(self, ids, training, start=0):
        """dropout(embeddings[ids] * sqrt(d_model) + positional encoding) (Sections 3.4, 3.5, 5.4).
        ids: (N, T) int32. start: the position of the first id. Returns (N, T, d_model)."""
        # (N, T, d_model)
        embedded = tf.nn.embedding_lookup(self.embeddings, ids) * self.config.d_model ** 0.5
        return dropout(embedded + positional_encoding(embedded, start), self.config.dropout_rate,
                       training)

    def final_ln(self, outputs):
        """Pre-layer-norm stacks end with one more layer norm; post-layer-norm ones
        are normalized already."""
        return ln(outputs, scope="final_ln") if self.config.norm_type == "pre" else outputs

    def sublayer_flags(self, training):
        """The keyword arguments every sublayer of this model takes."""
        cfg = self.config
        return dict(dropout_rate=cfg.dropout_rate, training=training, norm_type=cfg.norm_type)

    # ------------------------------------------------------ Section 3.1: encoder and decoder stacks
    def encode(self, xs, training=True):
        """xs: data_load.Sources, x (N, T1). Returns memory (N, T1, d_model) and src_masks (N, T1)
        bool, True at padding."""
        cfg = self.config
        src_masks = tf.equal(xs.x, PAD_ID)
        with tf1.variable_scope("encoder", reuse=tf1.AUTO_REUSE):
            enc = self.embed(xs.x, training)
            for i in range(cfg.num_blocks):
                with tf1.variable_scope("num_blocks_{}".format(i)):
                    enc, _ = multihead_attention(enc, None, src_masks, cfg.num_heads,
                                                 scope="multihead_attention",
                                                 attention_dropout=cfg.attention_dropout,
                                                 **self.sublayer_flags(training))
                    enc = ff(enc, [cfg.d_ff, cfg.d_model], relu_dropout=cfg.relu_dropout,
                             **self.sublayer_flags(training))
            memory = self.final_ln(enc)
        return memory, src_masks

    def decoder_block(self, dec, memory, src_masks, training, cache=None):
        """One decoder block (Section 3.1): masked self-attention, attention over
        the memory, feed-forward.

        dec: (N, T2, d_model). memory: (N, T1, d_model). src_masks: (N, T1). cache: None, or
        (decoding one position at a time, T2 = 1) the self-attention's keys and values of the
        positions before (multihead_attention).
        Returns (N, T2, d_model) and the cross-attention (N, h, T2, T1).
        The causal mask alone hides target padding: it only ever follows the real tokens.
        """
        cfg = self.config
        flags = dict(attention_dropout=cfg.attention_dropout, **self.sublayer_flags(training))
        dec, _ = multihead_attention(dec, None, None, cfg.num_heads, causality=cache is None,
                                     scope="self_attention", cache=cache, **flags)
        dec, attention = multihead_attention(dec, memory, src_masks, cfg.num_heads,
                                             scope="vanilla_attention", **flags)
        dec = ff(dec, [cfg.d_ff, cfg.d_model], relu_dropout=cfg.relu_dropout,
                 **self.sublayer_flags(training))
        return dec, attention

    def decode(self, ys, memory, src_masks, training=True):
        """ys: data_load.Targets, decoder_input and y (N, T2). memory: (N, T1, d_model). src_masks:
        (N, T1).

        Returns logits (N, T2, V), greedy ids y_hat (N, T2), y, and the last block's cross-attention
        (N, h, T2, T1).
        """
        decoder_input, y, _ = ys
        with tf1.variable_scope("decoder", reuse=tf1.AUTO_REUSE):
            dec = self.embed(decoder_input, training)
            for i in range(self.config.num_blocks):
                with tf1.variable_scope("num_blocks_{}".format(i)):
                    dec, attention = self.decoder_block(dec, memory, src_masks, training)
            dec = self.final_ln(dec)
        logits = self.logits(dec)
        return logits, tf.cast(tf.argmax(logits, axis=-1), tf.int32), y, attention

    def logits(self, dec):
        """The output projection, the transposed embedding matrix (Section 3.4).
        dec: (N, T, d_model). Returns (N, T, V)."""
        return tf.tensordot(dec, self.embeddings, axes=[[2], [1]])

    # ---------------------------------------------------------------- Section 5: training
    def loss(self, xs, ys):
        """Label-smoothed cross entropy (Section 5.4) summed over the non-pad target tokens, their
        count, and the last block's cross-attention (N, h, T2, T1). loss_sum / token_count is the
        per-token training loss. With config.rdrop > 0 the summed loss is R-Drop's (rdrop_loss)."""
        if self.config.rdrop:
            return self.rdrop_loss(xs, ys)
        memory, src_masks = self.encode(xs)
        logits, _, y, attention = self.decode(ys, memory, src_masks)  # logits: (N, T2, V)
        # (N, T2, V)
        targets = label_smoothing(tf.one_hot(y, self.config.vocab_size), self.config.smoothing)
        losses = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)  # (N, T2)
        nonpadding = tf.cast(tf.not_equal(y, PAD_ID), tf.float32)
        return tf.reduce_sum(losses * nonpadding), tf.reduce_sum(nonpadding), attention

    def rdrop_loss(self, xs, ys):
        """R-Drop (Liang et al., 2021, Eq. 3): the batch run twice with independent dropout masks,
        as one forward pass of its 2N rows (dropout draws each row's mask anew), and per non-pad
        target token the paper's loss halved,

            (CE(p1) + CE(p2) + alpha KL_sym(p1, p2)) / 2,  KL_sym = (KL(p1||p2) + KL(p2||p1)) / 2

        with CE the label-smoothed cross entropy and alpha config.rdrop, the paper's alpha. The
        paper sums the two passes' CE; we average them (and halve the KL term with them), so that
        the loss stays on the scale of a run without R-Drop and its learning rates compare.
        Returns, like loss, the sum over the N rows' non-pad tokens, their count (counted once)
        and the first pass's cross-attention (N, h, T2, T1)."""
        n = tf.shape(ys.y)[0]
        memory, src_masks = self.encode(twice(xs))
        logits, _, y, attention = self.decode(twice(ys), memory, src_masks)  # (2N, T2, V)
        targets = label_smoothing(tf.one_hot(y, self.config.vocab_size), self.config.smoothing)
        losses = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)  # (2N, T2)
        # (N, T2)
        token_losses = (losses[:n] + losses[n:]
                        + self.config.rdrop * symmetric_kl(logits[:n], logits[n:])) / 2
        nonpadding = tf.cast(tf.not_equal(y[:n], PAD_ID), tf.float32)
        return tf.reduce_sum(token_losses * nonpadding), tf.reduce_sum(nonpadding), attention[:n]

    def train(self, xs, ys, optimizer, token_count):
        """The loss of a batch and its gradients: the label-smoothed loss summed over the non-pad
        target tokens, divided by token_count (the batch's tokens; the global batch's when a replica
        takes a part of it, so that the replicas' losses add up to the batch's), or left a sum where
        token_count is None (accumulated batches: toolkit.training.step divides the sum of their
        gradients by all their tokens). optimizer: toolkit.training.step.make_optimizer's.

        Returns the loss, optimizer.compute_gradients of it ((gradient, variable) pairs) and the
        cross-attention (N, h, T2, T1).
        """
        loss_sum, _, attention = self.loss(xs, ys)
        loss = loss_sum if token_count is None else loss_sum / (token_count + 1e-7)
        return loss, optimizer.compute_gradients(loss), attention

    # ---------------------------------------------------------------- inference
    def cached_decoder(self, memory, src_masks):
        """Step function and initial state for decoding one position at a time
        (decoding.greedy_search and beam_search run it): each step runs the decoder on the new
        position only, its self-attention over the keys and values that the steps before left
        in the cache.

        memory: (B, T1, d_model). src_masks: (B, T1). Returns step_fn(tokens (B,), step, cache,
        parents=None) -> logits (B, V) and the cache with this step's keys and values appended
        (parents (B,): the cache rows that the B rows continue, in beam search), and the empty
        cache: per block {"keys", "values"}, each (B, h, 0, d_k).
        """
        cfg = self.config
        empty = tf.zeros([tf.shape(memory)[0], cfg.num_heads, 0, cfg.d_model // cfg.num_heads])
        cache = [{"keys": empty, "values": empty} for _ in range(cfg.num_blocks)]

        def step_fn(tokens, step, cache, parents=None):
            if parents is not None:
                cache = tf.nest.map_structure(lambda t: tf.gather(t, parents), cache)
            # new dicts: multihead_attention appends to them
            cache = [dict(block) for block in cache]
            with tf1.variable_scope("decoder", reuse=True):
                dec = self.embed(tokens[:, None], training=False, start=step)  # (B, 1, d_model)
                for i in range(cfg.num_blocks):
                    with tf1.variable_scope("num_blocks_{}".format(i)):
                        dec, _ = self.decoder_block(dec, memory, src_masks, False, cache[i])
                dec = self.final_ln(dec)
            return self.logits(dec)[:, 0, :], cache
        return step_fn, cache

    def teacher_forced(self, xs, ids):
        """The decoder run in eval mode on given translations ids (N, T) (ending in </s> then 0s).
        Returns logits (N, T, V) and the last block's cross-attention (N, h, T, T1)."""
        memory, src_masks = self.encode(xs, training=False)
        # (N, T)
        decoder_input = tf.concat([tf.fill([tf.shape(ids)[0], 1], BOS_ID), ids[:, :-1]], axis=1)
        logits, _, _, attention = self.decode((decoder_input, ids, None), memory, src_masks,
                                              training=False)
        return logits, attention

    def score(self, xs, ids, alpha=0.6):
        """Teacher-forced model score of given translations, the quantity beam search maximizes.

        ids: (N, T) ending in </s> then 0s. Returns (N,)
        log p(ids | x) / length_penalty(len, alpha).
        """
        log_probs = decoding_log_probs(self.teacher_forced(xs, ids)[0])  # (N, T, V)
        token_log_probs = tf.gather(log_probs, ids, batch_dims=2)  # (N, T)
        nonpadding = tf.cast(tf.not_equal(ids, PAD_ID), tf.float32)
        lengths = tf.reduce_sum(nonpadding, axis=1)
        return tf.reduce_sum(token_log_probs * nonpadding, axis=1) / length_penalty(lengths, alpha)

    def attention(self, xs, ids):
        """Cross-attention of the last decoder block for given translations ids (N, T):
        (N, h, T, T1)."""
        return self.teacher_forced(xs, ids)[1]

    def eval(self, xs, settings):
        """Translations of a batch, xs: data_load.Sources, x (N, T1), decoded as settings
        (a decoding.DecodingSettings) say: ids (N, T), their scores (N,) (train.py refuses to save
        a model whose scores are not finite), and an image summary of the first sentence's
        attention, cheap enough to fetch with every batch (one graph run then serves the whole dev
        set). The references are scored as text, outside the graph."""
        ids, scores = translate(self, xs, settings)
        first = type(xs)(*(t[:1] for t in xs))  # the first sentence, at the batch's width
        summaries = tf1.summary.image("eval_attention",
                                      attention_image(self.attention(first, ids[:1])))
        return ids, scores, summaries


def twice(batch):
    """A batch (data_load.Sources or Targets, fields (N, ...) or None) with its rows repeated: the
    N rows, then the same N again (2N, ...), R-Drop's two passes in one."""
    return type(batch)(*(None if t is None else tf.concat([t, t], axis=0) for t in batch))


def symmetric_kl(logits1, logits2):
    """(KL(p1 || p2) + KL(p2 || p1)) / 2 of p1 = softmax(logits1) and p2 = softmax(logits2) over
    the last axis, R-Drop's regulariser (Liang et al., 2021, Eq. 2), computed as
    sum_v (p1 - p2)(log p1 - log p2) / 2. logits1, logits2: (..., V). Returns (...,) float32."""
    log_p1 = tf.nn.log_softmax(tf.cast(logits1, tf.float32))
    log_p2 = tf.nn.log_softmax(tf.cast(logits2, tf.float32))
    return tf.reduce_sum((tf.exp(log_p1) - tf.exp(log_p2)) * (log_p1 - log_p2), axis=-1) / 2


#: Name of the variable that holds the step at which a decaying learning-rate schedule ends
#: (0: not fixed yet).
SCHEDULE_TOTAL_STEPS = "lr_schedule_total_steps"


def schedule_total_steps():
    """The int64 variable SCHEDULE_TOTAL_STEPS, saved with the checkpoints so that a resumed run
    continues the same schedule; train.py assigns it (budget.Budget) once the training budget is
    known in steps (it stays 0 under Noam, which has no end). Checkpoints written before it existed
    restore with it at 0 (logdir.OPTIONAL_VARIABLES)."""
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
        return tf1.get_variable(SCHEDULE_TOTAL_STEPS, initializer=tf.constant(0, tf.int64),
                                trainable=False)


def attention_image(attention):
    """attention: (N, h, T2, T1). Returns (1, T2, T1, 1): the first sentence's first
    head, for tf.summary.image."""
    return attention[:1, 0, :, :, None]
