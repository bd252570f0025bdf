"""A training step of train.py, in one place: the loss of a batch and its gradients
(Transformer.train), summed over --accum_steps batches when they accumulate, added up over the
replicas of a cluster, Adam's update (Section 5.3) on the learning-rate schedule, and
the step's summaries.

    step = build_step(hp, xs, ys, cluster)      # before any other part of the model
    loss, tokens, batches, summaries = step.run(sess, write_summaries)

The loss of a step is the sum of the label-smoothed losses of every target token of its batches
(every replica's, every accumulated batch's) divided by their count, whatever the batches are cut
into. With --accum_steps 1 a batch's op computes the gradients of its per-token loss and applies
them. With N > 1 each batch adds the gradients of its summed loss and its token count to
accumulators, and an op of its own divides their sums by the tokens and applies them: N batches of
n sentences make the update of one batch of N * n. The accumulators are local variables, never
saved: they are zero at every optimizer step, where checkpoints are written.

With a cluster (--distribute, toolkit.training.distributed) each replica takes its rows of the
global batch (replica_batch) and Adam sums the replicas' gradients before its one update; a single
process runs the same functions once, without a strategy.
"""
import dataclasses

import tensorflow as tf

from data_load import Sources, Targets
from fast import build_transformer, transformer_class
from model import PAD_ID, ModelConfig, attention_image, schedule_total_steps
from modules import noam_cooldown_scheme, noam_scheme, warmup_decay_scheme

tf1 = tf.compat.v1


@dataclasses.dataclass
class TrainStep:
    """What build_step builds. batch: the fetches of one batch, {"loss", "tokens", "summaries"} and
    "update" (its op); apply: the op that applies accumulated gradients (None with --accum_steps
    1, where a batch's update applies its own); apply_summaries: apply's summaries."""
    batch: dict
    apply: tf.Operation
    apply_summaries: tf.Tensor
    write_summaries: tf.Tensor  # bool placeholder, True unless fed: whether summaries are computed
    global_step: tf.Variable
    schedule_total: tf.Variable  # the schedule's end step (model.SCHEDULE_TOTAL_STEPS)
    accum_steps: int  # batches per optimizer step

    def run(self, sess, write_summaries):
        """One optimizer step over the next accum_steps batches of the iterator, fewer when the
        epoch ends first (tf.errors.OutOfRangeError before the first one goes on to the caller).

        Returns (loss per target token, target tokens, batches run, summaries: a list of serialized
        summaries, empty unless write_summaries)."""
        loss, tokens, batches = 0.0, 0, 0
        while batches < self.accum_steps:
            last = batches == self.accum_steps - 1
            try:
                out = sess.run(self.batch, {self.write_summaries: write_summaries and last})
            except tf.errors.OutOfRangeError:
                if not batches:
                    raise
                break
            loss, tokens, batches = loss + out["loss"], tokens + out["tokens"], batches + 1
        summaries = [out["summaries"]]
        if self.apply is not None:  # the batches' summed losses, per target token
            summaries.append(sess.run([self.apply, self.apply_summaries],
                                      {self.write_summaries: write_summaries})[1])
            loss /= max(tokens, 1)
        return loss, tokens, batches, [summary for summary in summaries if summary]


def make_optimizer(hp, global_step):
    """Adam (Section 5.3; the implementation's optimizer) on the learning-rate schedule of
    hp.lr_schedule. Returns optimizer, lr, and the variable that holds the schedule's
    end step (schedule_total_steps).

    Under --precision fp16 it is wrapped in dynamic loss scaling (Micikevicius et al., 2018): the
    loss is multiplied by a scale before differentiation so that small float16 gradients do not
    flush to zero, the gradients are divided by it, and a step with non-finite gradients is skipped
    and halves the scale (which doubles after 2,000 good steps).
    """
    schedule, total_steps = hp.lr_schedule, schedule_total_steps()
    if schedule == "noam":
        lr = noam_scheme(hp.lr, global_step, hp.warmup_steps)
    elif schedule == "noam_cooldown":
        lr = noam_cooldown_scheme(hp.lr, global_step, hp.warmup_steps, total_steps,
                                  hp.cooldown_fraction)
    else:
        lr = warmup_decay_scheme(hp.lr, global_step, hp.warmup_steps, total_steps, decay=schedule)
    config = ModelConfig.from_flags(hp)
    optimizer = transformer_class(config.impl).optimizer(config, lr)
    if hp.precision == "fp16":
        optimizer = tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
    return optimizer, lr, total_steps


def build_step(hp, xs, ys, cluster):
    """The training step of hp over the global batch xs, ys (data_load.py's layout) on cluster
    (distributed.make_cluster). Returns a TrainStep. Build it before any other part of the model:
    an evaluation Transformer built afterwards reuses its variables."""
    strategy = cluster.strategy or tf.distribute.get_strategy()  # the default: no-op
    write_summaries = tf1.placeholder_with_default(True, [], name="write_summaries")
    with strategy.scope():
        global_step = tf1.train.get_or_create_global_step()
        optimizer, lr, schedule_total = make_optimizer(hp, global_step)
        # the target tokens of the global batch (before the model: its random initial values and
        # dropout come after these ops, as they always have, so that a seed gives the same run)
        global_tokens = tf.reduce_sum(tf.cast(tf.not_equal(ys.y, PAD_ID), tf.float32))
        replica = ReplicaStep(ModelConfig.from_flags(hp), optimizer, global_step, global_tokens)
        if hp.accum_steps == 1:  # a batch's op computes its gradients and applies them
            loss, update, grads, attention = for_each_replica(cluster, replica.apply_batch, xs, ys)
            loss = sum_over_replicas(cluster, loss)
            batch_summaries = summaries_if(write_summaries, lambda: step_summaries(
                loss, lr, sum_over_replicas(cluster, grads), first_replica(cluster, attention)))
            apply = apply_summaries = None
        else:  # a batch's op adds to the accumulators; apply divides by the tokens and applies
            loss, update, attention = for_each_replica(cluster, replica.add_batch, xs, ys)
            loss = sum_over_replicas(cluster, loss)
            batch_summaries = summaries_if(write_summaries, lambda: tf1.summary.image(
                "attention", attention_image(first_replica(cluster, attention))))
            mean_loss, reset, grads = for_each_replica(cluster, replica.apply_sums)
            apply_summaries = summaries_if(write_summaries, lambda: step_summaries(
                sum_over_replicas(cluster, mean_loss), lr, sum_over_replicas(cluster, grads)))
            # the reset comes after the update and after every value the summaries read
            with tf.control_dependencies([apply_summaries]):
                apply = tf.group(local_results(cluster, reset))
    batch = dict(update=tf.group(local_results(cluster, update)), loss=loss, tokens=global_tokens,
                 summaries=batch_summaries)
    return TrainStep(batch, apply, apply_summaries, write_summaries, global_step, schedule_total,
                     hp.accum_steps)


class ReplicaStep:
    """What one replica does in a step (a single process: the one replica, on the whole batch).
    config: the model's ModelConfig; each replica builds the model (a cluster's variables are
    mirrored when the first replica makes them). global_tokens: the target tokens of the global
    batch, which a batch's loss is divided by."""

    def __init__(self, config, optimizer, global_step, global_tokens):
        self.config, self.optimizer = config, optimizer
        self.global_step, self.global_tokens = global_step, global_tokens
        self.variables = []  # the trainable variables, in Transformer.train's order

    def apply_batch(self, xs, ys):
        """--accum_steps 1: the batch's loss per target token, the op that applies its gradients,
        the gradients (dense) and the cross-attention."""
        loss, grads_and_vars, attention = build_transformer(self.config).train(
            xs, ys, self.optimizer, self.global_tokens)
        update = self.optimizer.apply_gradients(grads_and_vars, global_step=self.global_step)
        return loss, update, dense(grads_and_vars), attention

    def add_batch(self, xs, ys):
        """--accum_steps N > 1: the batch's summed loss, the op that adds its gradients, loss and
        target tokens to the accumulators, and the cross-attention."""
        loss_sum, grads_and_vars, attention = build_transformer(self.config).train(
            xs, ys, self.optimizer, None)
        self.variables[:] = [var for _, var in grads_and_vars]
        sums = accumulators(self.variables)
        adds = [total.assign_add(grad) for total, grad in zip(sums.grads, dense(grads_and_vars))]
        adds += [sums.loss.assign_add(loss_sum), sums.tokens.assign_add(self.global_tokens)]
        return loss_sum, tf.group(adds), attention

    def apply_sums(self):
        """The accumulated gradients divided by the accumulated tokens and applied: the loss per
        target token of the step's batches, the op that sets the accumulators to zero after the
        update, and the gradients applied."""
        sums = accumulators(self.variables)
        grads = [total / sums.tokens for total in sums.grads]
        update = self.optimizer.apply_gradients(zip(grads, self.variables),
                                                global_step=self.global_step)
        loss = sums.loss / sums.tokens
        with tf.control_dependencies([update, loss] + grads):
            reset = tf.group([total.assign(tf.zeros_like(total))
                              for total in sums.grads + [sums.loss, sums.tokens]])
        return tf.identity(loss), reset, grads


@dataclasses.dataclass
class Accumulators:
    """The sums a replica accumulates between optimizer steps: one per trainable variable, the
    summed loss and the target tokens."""
    grads: list
    loss: tf.Variable
    tokens: tf.Variable


def accumulators(variables):
    """The Accumulators of the current replica for the trainable variables, made on the first call
    and the same ones after. Local variables, one copy per replica (synchronized on read, never
    mirrored), not saved with the checkpoints."""
    def zeros(name, shape):
        with tf1.variable_scope("accumulated", reuse=tf1.AUTO_REUSE):
            return tf1.get_variable(name, shape, tf.float32, tf1.zeros_initializer(),
                                    trainable=False, collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.SUM)
    return Accumulators([zeros(var.name.split(":")[0], var.shape) for var in variables],
                        zeros("loss", []), zeros("tokens", []))


def step_summaries(loss, lr, grads, attention=None):
    """The step's summaries: loss, lr, grad_norm (of the gradients summed over the replicas) and
    the first replica's attention image (if given)."""
    values = [tf1.summary.scalar("loss", loss), tf1.summary.scalar("lr", lr),
              tf1.summary.scalar("grad_norm", tf.linalg.global_norm(grads))]
    if attention is not None:
        values.append(tf1.summary.image("attention", attention_image(attention)))
    return tf1.summary.merge(values)


def summaries_if(write_summaries, summaries):
    """summaries() computed only where write_summaries is True, else an empty string. Every step
    fetches them, so that every step runs the same fetches: a TensorFlow 1 session keeps an
    optimized copy of the graph, with its own kernels, for each set of fetches it has run."""
    return tf.cond(write_summaries, summaries, lambda: tf.constant(""))


def dense(grads_and_vars):
    """The gradients of optimizer.compute_gradients, the embedding's IndexedSlices made dense."""
    return [tf.convert_to_tensor(grad) for grad, _ in grads_and_vars]


# ---------------------------------------------------------------- replicas of a cluster
def for_each_replica(cluster, fn, *batch):
    """fn(*batch) in every replica of cluster, each on its rows of the global batch: in a single
    process (no strategy) one call on the whole batch."""
    if cluster.strategy is None:
        return fn(*batch)

    def on_my_rows(*batch):
        context = tf.distribute.get_replica_context()
        if batch and context.num_replicas_in_sync > 1:
            batch = replica_batch(*batch, context.replica_id_in_sync_group,
                                  context.num_replicas_in_sync)
        return fn(*batch)
    return cluster.strategy.extended.call_for_each_replica(on_my_rows, args=batch)


def sum_over_replicas(cluster, value):
    """The sum of a per-replica value (or of each of a list of them) over the replicas: the value
    itself in a single process."""
    if cluster.strategy is None:
        return value
    if isinstance(value, list):
        return [sum_over_replicas(cluster, item) for item in value]
    return cluster.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)


def local_results(cluster, value):
    """The per-replica values of this process, as a list."""
    if cluster.strategy is None:
        return [value]
    return list(cluster.strategy.experimental_local_results(value))


def first_replica(cluster, value):
    return local_results(cluster, value)[0]


def replica_rows(num_rows, replica_id, num_replicas):
    """Rows [start, end) of a global batch of num_rows that replica replica_id of num_replicas
    trains on. Scalars (int or int32 tensors). Rows are dealt in contiguous, nearly equal blocks
    (sizes differ by at most 1)."""
    return num_rows * replica_id // num_replicas, num_rows * (replica_id + 1) // num_replicas


def replica_batch(xs, ys, replica_id, num_replicas):
    """This replica's share of a global batch, trimmed to its longest source and target.

    xs: data_load.Sources, x (N, T1); ys: data_load.Targets, y (N, T2).
    Returns xs, ys of the same types with n = end - start rows (see replica_rows), (n, t1) and
    (n, t2).
    """
    start, end = replica_rows(tf.shape(xs.x)[0], replica_id, num_replicas)
    x_seqlen, y_seqlen = xs.x_seqlen[start:end], ys.y_seqlen[start:end]
    # max of () is -2^31
    t1, t2 = tf.maximum(tf.reduce_max(x_seqlen), 1), tf.maximum(tf.reduce_max(y_seqlen), 1)
    return (Sources(xs.x[start:end, :t1], x_seqlen),
            Targets(ys.decoder_input[start:end, :t2], ys.y[start:end, :t2], y_seqlen))
