"""The training budget: the global step at which train.py stops, and the end step of a learning-rate
schedule that decays to 0 when the budget ends (--max_steps, --num_epochs, or the steps that
--max_minutes buys at the step rate measured in the run).
"""
import math
import time

import numpy as np

from toolkit import distributed


class Budget:
    """Where training ends, in global steps, and the end step of a decaying learning-rate schedule
    (SCHEDULE_TOTAL_STEPS, saved with the checkpoints, so a resumed run continues the same
    schedule).

    --max_steps and --num_epochs are steps from the start. --max_minutes becomes steps once warm-up
    has ended (and at least MEASURED_STEPS steps of this run were timed): the step rate measured in
    this run times the time left, less the time of the dev evaluations planned before the deadline
    (each as long as those measured so far in this run). From then on the schedule is fixed;
    training still stops at the deadline if it comes first.
    """

    #: Steps of a run that are timed before a time budget is turned into steps; the first
    #: SKIPPED_STEPS are not timed (they build oneDNN kernels).
    MEASURED_STEPS, SKIPPED_STEPS = 100, 5

    def __init__(self, sess, g, hp, deadline, started, is_chief=True):
        """g: the training graph (train.TrainGraph). deadline: time.time() at which --max_minutes
        ends (inf if unset). started: time.time() when the tool started, for the start-up time
        printed at the first step."""
        self.sess, self.g, self.hp, self.deadline, self.is_chief = sess, g, hp, deadline, is_chief
        self.started = started
        self.total = int(sess.run(g.step.schedule_total))
        self.decaying = hp.lr_schedule != "noam"
        self.run_steps, self.timer_start, self.timed_from, self.eval_seconds = 0, None, None, []
        if self.decaying and not self.total and not hp.max_minutes:
            self.fix(self.step_budget())

    def step_budget(self):
        """The global step at which --max_steps or --num_epochs ends training. With --bpe_dropout
        the epochs differ by a few batches; the first epoch's count stands for each."""
        epochs = self.hp.num_epochs * self.g.train_num_batches(0)
        return min(self.hp.max_steps, epochs) if self.hp.max_steps else epochs

    def fix(self, total):
        """Sets the schedule's end step (once; agreed on by every worker) and tells the user."""
        self.total = distributed.agree_on_total(self.sess, self.g.step, total, self.is_chief)
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

    def after_step(self, step):
        """Called after every training step with the new global step; fixes a time budget once it
        can."""
        self.run_steps += 1
        if self.run_steps == 1:
            print("first step of this run %.1f s after start" % (time.time() - self.started),
                  flush=True)
        if self.run_steps == self.SKIPPED_STEPS:
            self.timer_start, self.timed_from, self.eval_seconds = time.time(), step, []
        if (not self.decaying or self.total or not self.hp.max_minutes
            or step < self.hp.warmup_steps
                or self.run_steps < self.SKIPPED_STEPS + self.MEASURED_STEPS):
            return
        now = time.time()
        # steps per second
        rate = (step - self.timed_from) / (now - self.timer_start - sum(self.eval_seconds))
        eval_s = float(np.mean(self.eval_seconds)) if self.eval_seconds else 0.0
        total = steps_in_time(step, rate, self.deadline - now, eval_s,
                              self.hp.eval_every * self.g.train_num_batches(0))
        self.fix(min(total, self.step_budget()))


def steps_in_time(step, rate, seconds_left, eval_seconds, steps_between_evals):
    """The global step that training at `rate` steps/s reaches in seconds_left from `step`, when a
    dev evaluation of eval_seconds comes every steps_between_evals steps (0: none before the
    end)."""
    if steps_between_evals and eval_seconds:
        seconds_left -= math.floor(seconds_left / (steps_between_evals / rate
                                                   + eval_seconds)) * eval_seconds
    return step + int(max(seconds_left, 0) * rate)
