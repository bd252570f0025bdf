"""Trains a Transformer on a data dir written by prepro.py.

    python train.py --data_dir data/numbers --logdir runs/numbers [flags]    (see --help)

Every epoch: translate the whole dev set, compute BLEU, write summaries and a checkpoint named after
the epoch, loss and BLEU. Started again with the same logdir, it resumes from the latest checkpoint
at the same global step, epoch and position in the epoch. Ctrl-C or SIGTERM saves a checkpoint first
(once per step; a dev decode is abandoned) and exits 130 / 143; a non-finite loss, weights or dev
decoding scores stop training without saving over the last good checkpoint, and so does a full disk.
One train.py at a time trains a logdir (LOGDIR/train.lock).

    python train.py --init_from RUN --suggestions DB --logdir NEW [flags]

fine-tunes RUN on the corrections users suggested (toolkit/training/corrections.py): a data dir is
built in NEW first, and after training NEW is kept only if it translates the held-out suggestions
better than RUN without losing more than --max_dev_drop dev BLEU; otherwise it is marked rejected
and train.py exits 3 (docs/corrections.md).
"""
import os
import time

STARTED = time.time()  # before TensorFlow is imported: start-up time counts from here

from toolkit.base import runtime  # first: TensorFlow's environment defaults
from toolkit.base import machine

import contextlib
import math
import sys
from argparse import Namespace

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from hparams import Hparams, check_ranges, parse_flags, resolved
from toolkit.serving.suggestions import Store
from toolkit.training import corrections, distributed
from toolkit.training.stopping import Budget
from toolkit.data.datadir import (MANIFEST_NAME, bpe_model_path, check_vocab, fingerprint,
                                  load_manifest, split_paths)
from toolkit.training.stopping import check_patience, early_stop, nothing_to_do
from toolkit.base.errors import DiskFull, UserError, is_disk_full
from toolkit.base.cli import run_cli
from fast import resolved_kernels
from toolkit.training.logdir import (HPARAMS_NAME, EventsFile, check_hparams_present,
                                     load_trained_hparams, logdir_lock, read_best, record_dev_bleu,
                                     remove_partial_checkpoints, save_hparams, save_variable_specs,
                                     trained_data_dir)
from toolkit.base.writing import atomic_write, check_not_owned, check_writable_dir
from toolkit.training.stopping import StopNow, StopRequest
from toolkit.base.reading import read_lines
from toolkit.training.checkpoints import (disk_full, init_checkpoint, last_good_checkpoint,
                                          restore_or_init, save)
from toolkit.training.flags import (check_init_vocab, check_resume_init, init_model_flags,
                                    init_source, with_config)
from toolkit.training.graph import build_graph
from utils import Progress, calc_bleu, get_hypotheses

tf1 = tf.compat.v1


def resolve_hparams(argv):
    """Command-line flags on top of --config FILE's, or on resume the logdir's hparams.json
    overridden by them.

    The model's shape can not change on resume, nor its vocabulary: vocab_size, vocab_sha256 and
    bpe_sha256 come from the data dir. A new run with --init_from takes the model-shape flags it is
    not given from the source run (init_model_flags); with --suggestions, its data dir is built
    first, in the new logdir (corrections.prepare). Every flag's range is checked before
    anything is built.
    """
    parser = Hparams(prog="train.py").parser
    hp, given = parse_flags(parser, argv)
    if hp.config:
        given = with_config(given, hp.config)
    trained_on = source = base_ckpt = None
    resumed = os.path.exists(os.path.join(hp.logdir, HPARAMS_NAME))
    if resumed:
        check_resume_init(hp.logdir, given)
        read_best(hp.logdir)  # a damaged best.json is refused before anything is written
        hp, trained_on = load_trained_hparams(hp.logdir, given), trained_data_dir(hp.logdir)
    else:
        check_hparams_present(hp.logdir)
        if given.get("init_from"):
            source, base_ckpt = init_source(given["init_from"])
            given = {**init_model_flags(given, source), **given}
        # the defaults of the flags not given
        hp = parser.parse_args([], namespace=Namespace(**given))
    check_ranges(hp)
    check_patience(hp)
    corrections.check_flags(given, hp.distribute, hp.logdir if resumed else None)
    if hp.suggestions and not resumed:  # a new fine-tune on suggestions: its data dir first
        hp.data_dir = corrections.prepare(hp, source, base_ckpt, Store)
    manifest = load_manifest(hp.data_dir, trained_on, hp.logdir, ("train", "eval"))
    if trained_on:
        check_vocab(hp, manifest, trained_on)
    hp = resolved(hp, **fingerprint(hp.data_dir, manifest),
                  precision=machine.resolved_precision(hp.impl, hp.precision),
                  kernels=resolved_kernels(hp.impl, hp.kernels))
    if source:
        check_init_vocab(hp, source)
    return hp, manifest


def check_splits(g, hp):
    """Refuses a training set that the length limits left empty (saying how many pairs they removed)
    and an empty dev set (whose BLEU means nothing), before anything is written to the logdir."""
    if not g.num_train:
        raise UserError("no training pairs left: all %d pairs of %s are longer than --maxlen1 %d / "
                        "--maxlen2 %d pieces (with </s>); raise the limits or pass --truncate"
                        % (g.num_over, hp.data_dir, hp.maxlen1, hp.maxlen2))
    if not g.num_eval:
        raise UserError("the dev split of %s is empty: rebuild it with prepro.py and a dev set"
                        % hp.data_dir)


def evaluate(sess, g, hp, sp, references, writer, step, epoch):
    """Translates the whole dev set, writes the hypotheses and summaries, returns BLEU. Raises
    FloatingPointError when a translation's score is not finite (as train_epoch does
    for non-finite weights)."""
    hypotheses, summary = get_hypotheses(sess, g.eval_init, g.eval_ids, g.xs.x_seqlen,
                                         g.eval_num_batches, g.eval_order, sp, desc="dev",
                                         scores_op=g.eval_scores, summary_op=g.eval_summaries)
    atomic_write(os.path.join(hp.logdir, "dev", "epoch%02d.txt" % epoch),
                 "".join(h + "\n" for h in hypotheses))
    bleu, _ = calc_bleu(references, hypotheses)
    if summary is not None:  # None: an empty dev set (check_splits refuses one)
        writer.add_summary(summary, step)
    writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(tag="dev_bleu", simple_value=bleu)]),
                       step)
    writer.flush()
    return bleu


def evaluate_or_save(sess, g, hp, sp, references, writer, step, epoch, epoch_step, name):
    """evaluate(), and when it fails, the weights it was scoring saved as NAME-STEP before the error
    goes on: an evaluation never loses what training did. Not when the failure is about the weights
    themselves (non-finite decoding scores: FloatingPointError) or is a full disk (DiskFull), where
    nothing may or can be saved."""
    try:
        return evaluate(sess, g, hp, sp, references, writer, step, epoch)
    except (FloatingPointError, DiskFull):
        raise
    except Exception:
        print("the dev evaluation failed; saved the weights of step %d as %s first"
              % (step, save(sess, g, hp, epoch, epoch_step, name)), file=sys.stderr, flush=True)
        raise


def train_epoch(sess, g, epoch, epoch_step, writer, summary_every, stop, budget):
    """Runs the steps of one epoch from batch epoch_step on, until its end, the budget's last step
    or deadline (a time.time() value), or a stop request; with several workers, the deadline or a
    stop request of any of them. Writes the training summaries with writer at every global step that
    is a multiple of summary_every.

    Each step trains on --accum_steps batches (fewer at the end of the epoch): a stop request is
    honoured between steps, never between the batches of one. Returns (batches done in this epoch,
    mean loss, target tokens/s, global step). Raises FloatingPointError on a non-finite loss, or
    when the weights or optimizer slots are not finite at the end (a non-finite gradient in the
    last step), so that they are never saved.
    """
    sess.run(g.train_init, {g.epoch: epoch, g.skip: epoch_step})
    total = g.train_num_batches(epoch)
    losses, tokens, start = [], 0, time.time()
    step = sess.run(g.step.global_step)
    progress = Progress(total, "epoch %d" % (epoch + 1), initial=epoch_step, unit="batches")
    while step < budget.last_step():
        any_signal, out_of_time = distributed.agree_to_stop(sess, g.votes, stop.signal,
                                                            time.time() >= budget.deadline)
        if any_signal:
            stop.signal = stop.signal or "a stop request of another worker"
        if any_signal or out_of_time:
            break
        try:
            loss, batch_tokens, batches, summaries = g.step.run(sess,
                                                                (step + 1) % summary_every == 0)
        except tf.errors.OutOfRangeError:
            break
        step += 1
        if not math.isfinite(loss):
            progress.close()
            raise FloatingPointError("loss is %s at step %d (epoch %d)" % (loss, step, epoch + 1))
        for summary in summaries:
            writer.add_summary(summary, step)
        epoch_step += batches
        budget.after_step(step)
        losses.append(loss)
        # once an epoch: the session's first step optimized the graph; hand back what it freed
        if len(losses) == 1:
            machine.release_freed_memory()
        tokens += batch_tokens
        progress.update(batches, loss="%.3f" % loss,
                        tok_s="%.0f" % (tokens / (time.time() - start)))
    progress.close()
    if not sess.run(g.weights_finite):
        raise FloatingPointError("the weights are not finite after step %d (epoch %d)"
                                 % (step, epoch + 1))
    return epoch_step, float(np.mean(losses)) if losses else float("nan"), tokens / (time.time()
                                                                                     - start), step


def main(argv=None):
    runtime.start_graph_mode()
    logdir = Hparams(prog="train.py").parser.parse_args(argv).logdir
    chief = distributed.is_chief_task()
    check_writable_dir(logdir, "logdir")
    check_not_owned(logdir, "logdir", {MANIFEST_NAME: "a data dir written by prepro.py"})
    with contextlib.ExitStack() as lock:
        # first: its hparams.json may be another run's, being written
        locked = chief and os.path.isdir(logdir)
        if locked:
            lock.enter_context(logdir_lock(logdir))
        hp, manifest = resolve_hparams(argv)
        cluster = distributed.make_cluster(hp, machine.session_config(hp))
        g = build_graph(hp, manifest, cluster)
        check_splits(g, hp)
        init_ckpt = init_checkpoint(hp)
        # a new logdir: created once the flags, the data and --init_from's weights are
        # known to be good (--suggestions builds its data dir in it before)
        if chief and not locked:
            os.makedirs(logdir, exist_ok=True)
            lock.enter_context(logdir_lock(logdir))
        os.makedirs(hp.logdir, exist_ok=True)
        code = train(hp, manifest, cluster, g, init_ckpt)
        if code or not hp.suggestions or not cluster.is_chief:
            return code
        return corrections.judge(hp)


def train(hp, manifest, cluster, g, init_ckpt=None):
    """Restores or initializes the graph g (from init_ckpt's weights, fine-tuning), and trains until
    the budget, a signal or an error ends."""
    if cluster.is_chief:
        save_hparams(hp, hp.logdir)
    num_params = save_variable_specs(hp.logdir)
    print("train: %d pairs (%d over maxlen1/maxlen2 %s), dev: %d sentences, model: %d parameters"
          % (g.num_train, g.num_over, "truncated" if hp.truncate else "skipped", g.num_eval,
             num_params))
    sp = spm.SentencePieceProcessor(model_file=bpe_model_path(hp.data_dir, manifest))
    references = read_lines(split_paths(hp.data_dir, manifest, "eval")["raw2"])
    if cluster.is_chief:
        remove_partial_checkpoints(hp.logdir)
    machine.release_library_pages()  # TensorFlow's start-up code, run once: out of the resident set
    with StopRequest() as stop, tf1.Session(cluster.target, config=cluster.config) as sess:
        last_ckpt = restore_or_init(sess, g, hp.logdir, init_ckpt)
        epoch, epoch_step = (int(v) for v in sess.run(g.training_state))
        step = sess.run(g.step.global_step)
        if last_ckpt:
            print("resumed from %s at step %d, epoch %d" % (last_ckpt, step, epoch + 1))
        deadline = time.time() + hp.max_minutes * 60 if hp.max_minutes else float("inf")
        budget = Budget(sess, g, hp, deadline, STARTED, cluster.is_chief)
        idle = nothing_to_do(hp, budget, step, epoch) if last_ckpt else None
        if idle:
            print(idle)
            print("done: step %d, epoch %d, last checkpoint %s" % (step, epoch, last_ckpt))
            return 0
        events = EventsFile(hp.logdir, None if last_ckpt
                            else sess.graph) if cluster.is_chief else EventsFile()
        try:
            step, epoch, last_ckpt = train_loop(sess, g, hp, cluster, stop, budget, events, sp,
                                                references, last_ckpt)
        except FloatingPointError as error:
            events.writer.close()
            good = last_good_checkpoint(g) or "none: no checkpoint was saved yet"
            raise UserError("%s; stopped without saving, the last good checkpoint is %s. Try a "
                            "lower --lr, a longer --warmup_steps%s"
                            % (error, good, " or --precision fp32"
                                                         if hp.precision != "fp32"
                               else "")) from None
        except (OSError, tf.errors.OpError) as error:  # DiskFull is a UserError, not an OSError
            if not is_disk_full(error):
                raise
            raise disk_full(DiskFull("the summaries", events.path or hp.logdir), g, hp,
                            events) from None
        except DiskFull as error:
            raise disk_full(error, g, hp, events) from None
        if stop.signal:
            return stop.exit_code()
        events.writer.close()
    print("done: step %d, epoch %d, last checkpoint %s" % (step, epoch, last_ckpt))
    return 0


def train_loop(sess, g, hp, cluster, stop, budget, events, sp, references, last_ckpt):
    """Epochs until the budget ends or a stop request: each ends with a dev evaluation (every
    --eval_every epochs and at the end) and a checkpoint. Returns (global step,
    epoch, last checkpoint)."""
    epoch, epoch_step = (int(v) for v in sess.run(g.training_state))
    step = sess.run(g.step.global_step)
    saved_step = step if last_ckpt else None
    while epoch < hp.num_epochs and step < budget.last_step() and not (
            distributed.agree_to_stop(sess, g.votes, stop.signal,
                                      time.time() >= budget.deadline)[1]):
        start = time.time()
        epoch_step, loss, tokens_per_s, step = train_epoch(sess, g, epoch, epoch_step,
                                                           events.writer, hp.summary_every, stop,
                                                           budget)
        if stop.signal:
            events.writer.close()
            # weights never trained are not worth a checkpoint that tools would take for a model
            if not step:
                print("%s: stopped before the first step; nothing to save" % stop.signal)
            elif cluster.is_chief:
                if saved_step != step:  # never a second checkpoint of one step
                    with stop.phase("finishing the checkpoint being saved"):
                        last_ckpt = save(sess, g, hp, epoch, epoch_step, "interrupted")
                print("%s: saved %s at step %d; run the same command to resume"
                      % (stop.signal, last_ckpt, step))
            else:
                print("%s: stopped at step %d; the chief saves the checkpoint"
                      % (stop.signal, step))
            return step, epoch, last_ckpt
        if epoch_step >= g.train_num_batches(epoch):
            epoch, epoch_step = epoch + 1, 0
        name, report, bleu = "E%02d_L%.2f" % (epoch, loss), "", None
        if not cluster.is_chief:
            print("epoch %d | step %d | loss %.3f | %s" % (epoch, step, loss, cluster.task),
                  flush=True)
            continue
        ending = (epoch_step or epoch == hp.num_epochs or step >= budget.last_step()
                  or time.time() >= budget.deadline)
        if (ending or (hp.eval_every and epoch % hp.eval_every == 0)) and not stop.signal:
            eval_start = time.time()
            try:
                with stop.phase("abandoning the dev evaluation, saving the checkpoint of step %d"
                                % step, True):
                    bleu = evaluate_or_save(sess, g, hp, sp, references, events.writer, step, epoch,
                                            epoch_step, name)
                budget.record_eval(time.time() - eval_start)
                name, report = name + "_B%.2f" % bleu, " | dev BLEU %.2f" % bleu
            except StopNow:
                pass
        with stop.phase("finishing the checkpoint being saved"):
            last_ckpt, saved_step = save(sess, g, hp, epoch, epoch_step, name), step
        print("epoch %d | step %d | loss %.3f | %.0f tgt tok/s | %.0f s%s | %s"
              % (epoch, step, loss, tokens_per_s, time.time() - start, report,
                 os.path.basename(last_ckpt)),
              flush=True)
        stopped = None if bleu is None else early_stop(hp,
                                                       record_dev_bleu(hp.logdir, last_ckpt, step,
                                                                       bleu))
        if stopped:
            print("early stop: %s" % stopped, flush=True)
            break
    return step, epoch, last_ckpt


if __name__ == "__main__":
    run_cli(main)
