"""When a training run ends: its budget (the global step at which train.py stops, and the end
step of a learning-rate schedule that decays to 0 then: --max_steps, --num_epochs, or the steps that
--max_minutes buys at the step rate observed in the run, estimated again as that rate changes),
--patience (dev evaluations in a row without a better BLEU), a resumed run whose budget is already
spent, and Ctrl-C or SIGTERM turned into a request to stop that the training loop honours where it
can save (after a step, after a save, or at once in a phase that may be abandoned: the dev decode).
"""
import contextlib
import math
import os
import signal
import sys
import time

import numpy as np

from toolkit.training import distributed
from toolkit.base.errors import UserError
from toolkit.training.logdir import read_best


class Budget:
    """Where training ends, in global steps, and the end step of a decaying learning-rate schedule
    (SCHEDULE_TOTAL_STEPS, saved with the checkpoints, so a resumed run continues
    the same schedule).

    --max_steps and --num_epochs are steps from the start. --max_minutes becomes steps once warm-up
    has ended (and at least MEASURED_STEPS steps of this run were timed): the step rate measured in
    this run times the time left, less the time of the dev evaluations planned before the deadline
    (each as long as those measured so far in this run). A machine's speed changes during a run
    (the first steps of each new batch shape build oneDNN kernels, other load comes and goes), so
    the end is estimated again about every REFIT_SECONDS from the step rate observed since the last
    estimate, and the schedule follows it; the loop then ends at about the deadline, which still
    stops training if it comes first. Only an end fixed from --max_minutes in this process moves: a
    schedule restored from a checkpoint keeps its end. Every worker of a multiworker run estimates
    again at the same steps (the chief's count of steps to the next estimate) and takes the chief's.
    """

    #: Steps of a run that are timed before a time budget is turned into steps; the first
    #: SKIPPED_STEPS are not timed (they build oneDNN kernels).
    MEASURED_STEPS, SKIPPED_STEPS = 100, 5

    #: Seconds between estimates of a time budget's end: a minute holds dozens of steps at the
    #: recipe's ~1 step/s, so one slow step moves the rate little, and the end catches up with a
    #: change of speed within a minute, under 2% of an hour's run.
    REFIT_SECONDS = 60

    #: A new estimate of the end is printed when it moved by this fraction since the one printed
    #: last (each estimate takes effect, printed or not).
    PRINT_CHANGE = 0.01

    def __init__(self, sess, g, hp, deadline, started, is_chief=True, clock=time.time):
        """g: the training graph (train.TrainGraph). deadline: clock() at which --max_minutes
        ends (inf if unset). started: clock() when the tool started, for the start-up time
        printed at the first step. clock: the time in seconds (a test's fake one)."""
        self.sess, self.g, self.hp, self.deadline, self.is_chief = sess, g, hp, deadline, is_chief
        self.started, self.clock = started, clock
        self.total = int(sess.run(g.step.schedule_total))
        self.decaying = hp.lr_schedule != "noam"
        self.run_steps, self.eval_seconds = 0, []
        # the time budget's end: whether this process set it, the step of its next estimate, the
        # one printed last, and the (clock, step, dev evaluation seconds) since the last estimate
        self.follows_time, self.next_estimate, self.printed, self.window = False, None, None, None
        if self.decaying and not self.total and not hp.max_minutes:
            self.fix(self.step_budget())

    def steps_per_epoch(self):
        """Optimizer steps in an epoch: its batches, --accum_steps to a step (the last step of an
        epoch takes the batches left). With --bpe_dropout the epochs differ by a few batches; the
        first epoch's count stands for each."""
        return math.ceil(self.g.train_num_batches(0) / self.hp.accum_steps)

    def step_budget(self):
        """The global step at which --max_steps or --num_epochs ends training."""
        epochs = self.hp.num_epochs * self.steps_per_epoch()
        return min(self.hp.max_steps, epochs) if self.hp.max_steps else epochs

    def fix(self, total):
        """Sets the schedule's end step of a step budget (once, at the start; agreed on by every
        worker) and tells the user."""
        self.total = distributed.agree_on_total(self.sess, self.g.votes, total, self.is_chief)
        self.sess.run(self.g.set_schedule_total, {self.g.new_schedule_total: self.total})
        print("learning rate: %s decay to 0 at step %d" % (self.hp.lr_schedule, self.total),
              flush=True)

    def last_step(self):
        """Training stops before the step with this number (float("inf") when only time or signals
        stop it)."""
        ends = [self.hp.max_steps or float("inf")]
        if self.decaying and self.total:
            ends.append(self.total)
        return min(ends)

    def record_eval(self, seconds):
        """A dev evaluation of this run took seconds (left out of the step rate, and reserved for
        later ones)."""
        self.eval_seconds.append(seconds)
        if self.window:
            self.window[2].append(seconds)

    def after_step(self, step):
        """Called after every training step with the new global step; turns a time budget into the
        schedule's end once it can, then estimates that end again every REFIT_SECONDS or so."""
        self.run_steps += 1
        now = self.clock()
        if self.run_steps == 1:
            print("first step of this run %.1f s after start" % (now - self.started), flush=True)
        if self.run_steps == self.SKIPPED_STEPS:
            self.window, self.eval_seconds = (now, step, []), []
        if self.follows_time:
            if step >= self.next_estimate:
                self.follow_time(step, now)
            return
        if (self.decaying and not self.total and self.hp.max_minutes
                and step >= self.hp.warmup_steps
                and self.run_steps >= self.SKIPPED_STEPS + self.MEASURED_STEPS):
            self.follows_time = True
            self.follow_time(step, now)

    def follow_time(self, step, now):
        """Sets the schedule's end to the step that the rate observed since the last estimate (or
        since timing began) reaches at the deadline, capped by the step budget; every worker calls
        it at the same step and takes the chief's end and steps to the next estimate."""
        since, from_step, evals = self.window
        # a clock that has not moved (only a test's can) gives no rate to divide by
        rate = (step - from_step) / max(now - since - sum(evals), 1e-6)  # steps per second
        eval_s = float(np.mean(self.eval_seconds)) if self.eval_seconds else 0.0
        total = min(steps_in_time(step, rate, self.deadline - now, eval_s,
                                  self.hp.eval_every * self.steps_per_epoch()),
                    self.step_budget())
        self.total = distributed.agree_on_total(self.sess, self.g.votes, total, self.is_chief)
        self.next_estimate = step + distributed.agree_on_total(
            self.sess, self.g.votes, max(1, round(self.REFIT_SECONDS * rate)), self.is_chief)
        self.window = (now, step, [])
        self.sess.run(self.g.set_schedule_total, {self.g.new_schedule_total: self.total})
        moved = self.printed is None or abs(self.total - self.printed) >= (self.PRINT_CHANGE
                                                                           * self.printed)
        if moved:
            self.printed = self.total
            print("learning rate: %s decay to 0 at step %d (%.2f steps/s observed)"
                  % (self.hp.lr_schedule, self.total, rate), flush=True)


def steps_in_time(step, rate, seconds_left, eval_seconds, steps_between_evals):
    """The global step that training at `rate` steps/s reaches in seconds_left from `step`, when a
    dev evaluation of eval_seconds comes every steps_between_evals steps
    (0: none before the end)."""
    if steps_between_evals and eval_seconds:
        seconds_left -= math.floor(seconds_left / (steps_between_evals / rate
                                                   + eval_seconds)) * eval_seconds
    return step + int(max(seconds_left, 0) * rate)


def check_patience(hp):
    """--patience counts dev evaluations of the one process that makes them."""
    if hp.patience and not hp.eval_every:
        raise UserError("--patience %d counts dev evaluations, which --eval_every 0 leaves to the "
                        "end: pass --eval_every 1 or more" % hp.patience)
    if hp.patience and hp.distribute == "multiworker":
        raise UserError("--patience needs a run in one process: it is not supported with "
                        "--distribute multiworker")


def early_stop(hp, best):
    """Why --patience ends training (a phrase) given best.json's dict (logdir.read_best),
    or None."""
    if not (hp.patience and best and best["evals_without_gain"] >= hp.patience):
        return None
    return ("--patience %d: %d dev evaluations in a row without a better BLEU than %.2f, that of %s"
            % (hp.patience, best["evals_without_gain"], best["bleu"], best["checkpoint"]))


def nothing_to_do(hp, budget, step, epoch):
    """The line a resumed run prints when its logdir has already trained to the end of its budget or
    stopped early (--patience), naming that end and how to train longer;
    None when there is training left."""
    stopped = early_stop(hp, read_best(hp.logdir))
    if stopped:
        return ("nothing to do: %s stopped early, %s; to train longer, resume with a higher "
                "--patience" % (hp.logdir, stopped))
    if budget.decaying and budget.total and step >= budget.total:
        end = "its --lr_schedule %s decayed to 0 at step %d" % (hp.lr_schedule, budget.total)
    elif hp.max_steps and step >= hp.max_steps:
        end = "--max_steps %d (given, or saved in its hparams.json)" % hp.max_steps
    elif epoch >= hp.num_epochs:
        end = "--num_epochs %d (given, or saved in its hparams.json)" % hp.num_epochs
    else:
        return None
    longer = ("start a new --logdir, or resume with --lr_schedule noam (which has no end) and a "
              "higher --max_steps or --num_epochs" if budget.decaying else "resume with a higher "
              "--max_steps or --num_epochs")
    return ("nothing to do: %s is at step %d (%d epochs done), where %s ends training; to train "
            "longer, %s" % (hp.logdir, step, epoch, end, longer))


class StopRequest:
    """While in its `with` block, turns SIGINT and SIGTERM into a request to stop, acknowledged at
    once with one line on stderr that says what is being finished: the training loop checks it after
    each step, a save is finished, and a phase run `with stop.phase(what, abandon=True)` (the dev
    decode) is abandoned at once (StopNow). The previous handlers come back afterwards."""

    def __enter__(self):
        self.signal, self.signum, self._doing = None, None, ("finishing the current step", False)
        self._previous = {sig: signal.signal(sig, self._handle) for sig
                          in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextlib.contextmanager
    def phase(self, doing, abandon=False):
        """Within the block, a stop request says `doing` ("finishing the checkpoint being saved")
        and, with abandon, raises StopNow where the block is."""
        previous, self._doing = self._doing, (doing, abandon)
        try:
            if abandon and self.signal:
                raise StopNow()
            yield
        finally:
            self._doing = previous

    def exit_code(self):
        """128 + the number of the signal received (130 for SIGINT, 143 for SIGTERM),
        0 without one."""
        return 128 + self.signum if self.signum else 0

    def _handle(self, signum, frame):
        doing, abandon = self._doing
        if self.signal is None:
            os.write(sys.stderr.fileno(),
                     ("%s: %s, then stopping\n" % (signal.Signals(signum).name, doing)).encode())
        self.signal, self.signum = signal.Signals(signum).name, signum
        if abandon:
            raise StopNow()


class StopNow(KeyboardInterrupt):
    """A stop request that abandons the phase it came in (see StopRequest.phase); a
    KeyboardInterrupt, so that no `except Exception` takes it for the phase's failure."""
