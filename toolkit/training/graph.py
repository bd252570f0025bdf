"""The graph train.py runs: the training step (toolkit/training/step.py) over one iterator of
training and dev batches, the dev set's translation, the cluster's votes, and the state saved with
the weights (the position in the epochs, the schedule's end step)."""
import collections.abc
import dataclasses

import numpy as np
import tensorflow as tf

from data_load import Sources, eval_order, get_batch
from decoding import DecodingSettings
from model import ModelConfig
from fast import build_transformer
from toolkit.training import distributed
from toolkit.training.step import TrainStep, build_step

tf1 = tf.compat.v1


@dataclasses.dataclass
class TrainGraph:
    """What build_graph builds for the training loop."""
    step: TrainStep  # one optimizer step: its batches, its update, its summaries
    votes: distributed.Votes  # what the processes of a cluster agree on
    # data: one iterator, initialized by train_init (for epoch `epoch`, its first `skip` batches
    # skipped) or eval_init; xs is its source side
    epoch: tf.Tensor
    skip: tf.Tensor
    train_init: tf.Operation
    eval_init: tf.Operation
    xs: Sources
    train_num_batches: collections.abc.Callable  # epoch -> batches in it
    eval_num_batches: int
    eval_order: np.ndarray  # the dev line of each row the eval batches give, in turn
    num_train: int  # training pairs within --maxlen1/--maxlen2 (or truncated)
    num_over: int  # training pairs over them
    num_eval: int
    # dev translation: ids (N, T), scores (N,), attention image
    eval_ids: tf.Tensor
    eval_scores: tf.Tensor
    eval_summaries: tf.Tensor
    # saved with the weights: [completed epochs, batches done in the current epoch], and the
    # schedule's end step (the variable is step.schedule_total)
    training_state: tf.Variable
    new_state: tf.Tensor
    save_state: tf.Tensor
    new_schedule_total: tf.Tensor
    set_schedule_total: tf.Tensor
    weights_finite: tf.Tensor  # every float variable (optimizer slots too) is finite
    saver: tf1.train.Saver
    init: tf.Operation
    local_init: tf.Operation  # the step's accumulators, never saved: zero at every start


def build_graph(hp, manifest, cluster):
    """Train and eval graphs over one iterator, the training step on cluster
    (distributed.make_cluster). Returns a TrainGraph."""
    # workers' dropout differs; initial values are the chief's
    tf1.set_random_seed(hp.seed + cluster.process_index)
    epoch, skip = tf1.placeholder_with_default(0, []), tf1.placeholder_with_default(0, [])
    train_batches, train_num_batches, num_train, num_over = get_batch(
        hp.data_dir, manifest, "train", hp.maxlen1, hp.maxlen2, hp.batch_size, shuffle=True,
        batch_type=hp.batch_type, seed=hp.seed, truncate=hp.truncate, epoch=epoch, skip=skip,
        growth=hp.bucket_growth, bpe_dropout=hp.bpe_dropout)
    eval_batches, eval_num_batches, num_eval, _ = get_batch(hp.data_dir, manifest, "eval", None,
                                                            None, hp.test_batch_size)
    iterator = tf1.data.Iterator.from_structure(tf1.data.get_output_types(train_batches),
                                                tf1.data.get_output_shapes(train_batches))
    xs, ys = iterator.get_next()

    # first: it creates the (mirrored) variables
    step = build_step(hp, xs, ys, cluster)
    votes = distributed.build_votes(cluster)
    model = build_transformer(ModelConfig.from_flags(hp))  # the training step's variables, reused
    eval_ids, eval_scores, eval_summaries = model.eval(xs, DecodingSettings.from_flags(hp))
    training_state = tf1.get_variable("training_state", initializer=tf.constant([0, 0], tf.int64),
                                      trainable=False)
    new_state = tf1.placeholder(tf.int64, [2])
    new_schedule_total = tf1.placeholder(tf.int64, [])
    weights_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v
                                    in tf1.global_variables() if v.dtype.base_dtype.is_floating])
    return TrainGraph(
        step=step, votes=votes, epoch=epoch, skip=skip,
        train_init=iterator.make_initializer(train_batches),
        eval_init=iterator.make_initializer(eval_batches), xs=xs,
        train_num_batches=train_num_batches,
        eval_num_batches=eval_num_batches(), eval_order=eval_order(hp.data_dir, manifest, "eval"),
        num_train=num_train, num_over=num_over, num_eval=num_eval, eval_ids=eval_ids,
        eval_scores=eval_scores, eval_summaries=eval_summaries, training_state=training_state,
        new_state=new_state, save_state=tf1.assign(training_state, new_state),
        new_schedule_total=new_schedule_total,
        set_schedule_total=step.schedule_total.assign(new_schedule_total),
        weights_finite=weights_finite, saver=tf1.train.Saver(max_to_keep=hp.keep_checkpoints,
                                                             save_relative_paths=True),
        init=tf1.global_variables_initializer(), local_init=tf1.local_variables_initializer())
