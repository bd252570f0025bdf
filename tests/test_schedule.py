"""Training budgets: the decaying learning-rate schedule's end step, --precision auto, and logdirs written before
either existed."""
import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import avg_checkpoints
from toolkit.training import distributed, stopping
import export
from toolkit.base import runtime
from toolkit.base import machine
import test as test_cli
import train
from model import SCHEDULE_TOTAL_STEPS

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "v1_model"
TINY_MODEL = ["--d_model", "16", "--d_ff", "32", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "1000",
              "--test_batch_size", "8", "--threads", "1"]


def checkpoint_values(ckpt):
    reader = tf.train.load_checkpoint(str(ckpt))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


# ------------------------------------------------------------------------------------------------
# The step a time budget reaches


def test_steps_in_time_without_evaluations_is_rate_times_time():
    assert stopping.steps_in_time(step=800, rate=1.25, seconds_left=3000, eval_seconds=0, steps_between_evals=0) \
        == 800 + 3750


def test_steps_in_time_leaves_out_the_evaluations_that_fall_before_the_deadline():
    # An epoch of 250 steps takes 200 s at 1.25 steps/s, then a 50 s evaluation: 3000 s hold 12 such cycles, and
    # the 2400 s of training in them make 3000 steps.
    assert stopping.steps_in_time(800, 1.25, 3000, eval_seconds=50, steps_between_evals=250) == 800 + 3000
    # Evaluating every 4 epochs: 3000 s hold 3 cycles of 800 + 50 s, so 150 s go to evaluations.
    assert stopping.steps_in_time(800, 1.25, 3000, eval_seconds=50, steps_between_evals=1000) == 800 + 3562


def test_steps_in_time_past_the_deadline_is_the_current_step():
    assert stopping.steps_in_time(500, 2.0, -30, 0, 0) == 500


# ------------------------------------------------------------------------------------------------
# A time budget's end follows the step rate: Budget on a fake session and clock (no training, no sleeping)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeSession:
    """Runs what Budget runs: reads the schedule's end (total), assigns it (each assignment kept in assigned), and
    the total vote, by vote(mine) when there is a cluster."""

    def __init__(self, g, total=0, vote=None):
        self.g, self.total, self.assigned, self.vote = g, total, [], vote

    def run(self, fetch, feed=None):
        if fetch is self.g.step.schedule_total:
            return self.total
        if fetch is self.g.set_schedule_total:
            self.total = feed[self.g.new_schedule_total]
            self.assigned.append(self.total)
            return None
        assert fetch is self.g.votes.total.mean and self.vote
        return self.vote(feed[self.g.votes.total.mine])


def fake_graph(processes=1):
    """What Budget reads of train.TrainGraph: epochs of 1,000 steps, and votes of one process (whose mean is the
    vote itself, so nothing runs) or of several."""
    votes = []
    for _ in distributed.Votes._fields:
        mine = object()
        votes.append(distributed.Vote(mine, mine if processes == 1 else object()))
    return SimpleNamespace(step=SimpleNamespace(schedule_total=object()), set_schedule_total=object(),
                           new_schedule_total=object(), votes=distributed.Votes(*votes),
                           train_num_batches=lambda epoch: 1000)


def budget_hparams(**flags):
    values = dict(lr_schedule="linear", max_minutes=60, warmup_steps=200, max_steps=0, num_epochs=1000,
                  accum_steps=1, eval_every=0)
    values.update(flags)
    return SimpleNamespace(**values)


def fake_budget(hp=None, total=0):
    """A Budget of a run that starts at 0 s on a fake clock, with the deadline of hp.max_minutes."""
    hp, clock = hp or budget_hparams(), FakeClock()
    sess = FakeSession(fake_graph(), total)
    deadline = hp.max_minutes * 60 if hp.max_minutes else float("inf")
    return stopping.Budget(sess, sess.g, hp, deadline, started=0.0, clock=clock), sess, clock


def train_for_time(budget, clock, seconds_per_step, deadline=True):
    """Trains as train_epoch does, on the fake clock: steps until the budget's last step (or, with deadline, its
    deadline), each taking seconds_per_step(its number) seconds. Returns the schedule's end after each step."""
    step, totals = 0, []
    while step < budget.last_step() and not (deadline and clock.now >= budget.deadline):
        step += 1
        clock.now += seconds_per_step(step)
        budget.after_step(step)
        totals.append(budget.total)
    return totals


def printed_ends(out):
    return [int(line.split(" at step ")[1].split()[0]) for line in out.splitlines()
            if line.startswith("learning rate:")]


@pytest.mark.parametrize("before, after, filling", [
    # 1 step/s for 300 s, then 2 steps/s for the 3,300 s left
    (1.0, 0.5, 300 + 3300 * 2),
    # 2 steps/s for 150 s, then 1 step/s for the 3,450 s left
    (0.5, 1.0, 300 + 3450),
])
def test_a_time_budget_ends_at_the_deadline_when_the_rate_changes_after_its_first_estimate(before, after, filling,
                                                                                            capsys):
    budget, sess, clock = fake_budget()
    totals = train_for_time(budget, clock, lambda step: before if step <= 300 else after)
    # the first estimate, after warm-up (step 200), came from the rate before the change
    assert totals[199] == 200 + int((3600 - 200 * before) / before)
    assert abs(budget.total - filling) <= 0.01 * filling and sess.total == budget.total
    # the loop ended at the schedule's end or at the deadline, within 1% of the deadline either way
    assert len(totals) == budget.total or clock.now >= 3600
    assert abs(clock.now - 3600) <= 0.01 * 3600
    ends = printed_ends(capsys.readouterr().out)
    assert ends[0] == totals[199] and 2 <= len(ends) < len(sess.assigned)


def test_only_an_end_that_moved_by_one_percent_since_the_last_printed_is_printed(capsys):
    budget, sess, clock = fake_budget()
    # a rate that wobbles by 0.5% around 1 step/s: estimated again and again, printed once
    train_for_time(budget, clock, lambda step: 1.005 if step % 2 else 0.995)
    assert len(printed_ends(capsys.readouterr().out)) == 1 and len(sess.assigned) > 50
    assert abs(budget.total - 3600) <= 0.01 * 3600

    budget, sess, clock = fake_budget()
    # a machine that speeds up slowly: each estimate moves the end a little, and the log says so every 1% or more
    train_for_time(budget, clock, lambda step: 1 / (1 + step / 5000))
    ends = printed_ends(capsys.readouterr().out)
    assert len(ends) >= 3 and len(sess.assigned) > len(ends) and set(ends) <= set(sess.assigned)
    assert all(abs(later - earlier) >= 0.01 * earlier for earlier, later in zip(ends, ends[1:]))
    assert sess.assigned[-1] == budget.total and abs(budget.total - ends[-1]) < 0.01 * ends[-1]


def test_a_schedule_restored_from_a_checkpoint_keeps_its_end(capsys):
    budget, sess, clock = fake_budget(total=5000)
    totals = train_for_time(budget, clock, lambda step: 1.0 if step <= 300 else 0.5)
    assert set(totals) == {5000} and len(totals) == 5000 and sess.assigned == []
    assert "learning rate" not in capsys.readouterr().out


@pytest.mark.parametrize("flags", [dict(max_minutes=0, max_steps=3000), dict(lr_schedule="noam")])
def test_without_a_time_budget_or_with_noam_the_end_never_follows_the_rate(flags):
    budget, sess, clock = fake_budget(budget_hparams(**flags))
    train_for_time(budget, clock, lambda step: 1.0 if step <= 300 else 0.5)
    assert sess.assigned == ([3000] if flags.get("max_steps") else [])


def test_a_time_budget_capped_by_the_step_budget_ends_there():
    budget, sess, clock = fake_budget(budget_hparams(max_steps=2000))
    train_for_time(budget, clock, lambda step: 1.0 if step <= 300 else 0.5)
    assert set(sess.assigned) == {2000} and budget.total == 2000


def test_every_worker_estimates_the_end_at_the_same_steps_and_takes_the_chiefs():
    """Two workers of different speeds, each in a thread, whose total votes meet (a barrier would time out, and the
    test fail, if one voted at a step the other did not)."""
    barrier, votes, errors = threading.Barrier(2, timeout=30), {}, []

    def mean_of(index):
        def vote(mine):
            votes[index] = np.asarray(mine, dtype=np.float64)
            barrier.wait()
            mean = (votes[0] + votes[1]) / 2
            barrier.wait()
            return mean
        return vote

    def worker(index, seconds_per_step, totals):
        g, clock = fake_graph(processes=2), FakeClock()
        sess = FakeSession(g, vote=mean_of(index))
        budget = stopping.Budget(sess, g, budget_hparams(), 3600, 0.0, is_chief=index == 0, clock=clock)
        try:
            totals.extend(train_for_time(budget, clock, seconds_per_step, deadline=False))
        except Exception as error:  # noqa: BLE001 (reported by the main thread)
            errors.append(error)
            barrier.abort()

    chief, other = [], []
    threads = [threading.Thread(target=worker, args=(0, lambda step: 1.0 if step <= 300 else 0.5, chief)),
               threading.Thread(target=worker, args=(1, lambda step: 0.8, other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and chief == other
    assert abs(chief[-1] - 6900) <= 0.01 * 6900  # the chief's rate fills its deadline


# ------------------------------------------------------------------------------------------------
# --precision auto


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Some CPU @ 2.00GHz
flags\t\t: fpu sse2 avx avx2 fma {extra}

processor\t: 1
model name\t: Some CPU @ 2.00GHz
flags\t\t: fpu sse2 avx avx2 fma {extra}
"""


@pytest.mark.parametrize("extra, max_isa, gpu, expected", [
    ("", None, False, "fp32"),  # AVX2 only
    ("avx512f avx512bw", None, False, "fp32"),  # AVX-512 without bfloat16
    ("avx512f avx512_bf16", None, False, "bf16"),
    ("avx512f avx512_bf16 amx_bf16 amx_tile", None, False, "bf16"),
    ("avx512f avx512_bf16", "AVX2", False, "fp32"),  # oneDNN capped below its bfloat16 kernels
    ("avx512f avx512_bf16", "avx512_core", False, "fp32"),
    ("avx512f avx512_bf16", "AVX512_CORE_BF16", False, "bf16"),
    ("avx512f avx512_bf16 amx_bf16", "AVX512_CORE_AMX", False, "bf16"),
    ("", None, True, "fp16"),
])
def test_precision_auto_follows_the_cpu_flags(tmp_path, extra, max_isa, gpu, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(extra=extra))
    model, flags = machine.cpu_info(str(cpuinfo))
    assert model == "Some CPU @ 2.00GHz" and {"avx2", "fma"} <= flags
    precision, note = machine.choose_precision("auto", flags, max_isa, gpu)
    assert precision == expected and note.startswith("precision auto: " + expected)


def test_an_explicit_bf16_without_native_bfloat16_is_kept_with_a_warning():
    precision, note = machine.choose_precision("bf16", {"avx2", "avx512f"})
    assert precision == "bf16" and note.startswith("warning:") and "slower than fp32" in note
    assert machine.choose_precision("bf16", {"avx512_bf16"}) == ("bf16", None)
    assert machine.choose_precision("fp32", {"avx512_bf16"}) == ("fp32", None)


def test_threads_set_both_pools_and_zero_means_the_usable_cores(monkeypatch):
    from argparse import Namespace

    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    config = machine.session_config(Namespace(threads=0))
    assert (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads) == (3, 3)
    config = machine.session_config(Namespace(threads=1))
    assert (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads) == (1, 1)


def test_a_missing_cpuinfo_means_no_flags(tmp_path):
    assert machine.cpu_info(str(tmp_path / "absent")) == ("unknown", set())


# ------------------------------------------------------------------------------------------------
# The schedule's end step, saved and resumed


@pytest.fixture(scope="module")
def data_dir():
    return str(FIXTURE / "numbers")


@pytest.mark.slow
def test_a_step_budget_fixes_the_end_of_the_schedule_from_the_start(data_dir, tmp_path, capsys):
    logdir = str(tmp_path / "run")
    assert train.main(["--data_dir", data_dir, "--logdir", logdir, "--max_steps", "12", "--warmup_steps", "4",
                       "--eval_every", "0"] + TINY_MODEL) == 0
    out = capsys.readouterr().out
    assert "learning rate: linear decay to 0 at step 12" in out and "done: step 12" in out
    values = checkpoint_values(tf.train.latest_checkpoint(logdir))
    assert values[SCHEDULE_TOTAL_STEPS] == 12 and values["global_step"] == 12


@pytest.mark.slow
def test_a_time_budget_fixes_the_end_and_a_resumed_run_ends_at_the_same_step(data_dir, tmp_path, capsys,
                                                                              monkeypatch):
    # 10 timed steps, not 100: a loaded machine makes fewer than 100 of these steps in 15 s
    monkeypatch.setattr(stopping.Budget, "MEASURED_STEPS", 10)
    logdir = str(tmp_path / "run")
    args = ["--data_dir", data_dir, "--logdir", logdir, "--warmup_steps", "10", "--num_epochs", "100000",
            "--eval_every", "0"] + TINY_MODEL
    assert train.main(args + ["--max_minutes", "0.25"]) == 0
    out = capsys.readouterr().out
    printed = printed_ends(out)[-1]
    first = checkpoint_values(tf.train.latest_checkpoint(logdir))
    # The total came from the rate observed after warm-up and 10 timed steps (and again as it changed), to end at
    # the deadline; the end printed last is within 1% of the one saved.
    total = first[SCHEDULE_TOTAL_STEPS]
    assert total >= 15 and abs(total - printed) < 0.01 * printed
    assert first["global_step"] <= total

    # Again, with time enough for more steps: it goes on along the saved schedule to its end, which never moves.
    assert train.main(args + ["--max_minutes", "2"]) == 0
    out = capsys.readouterr().out
    assert "learning rate:" not in out and "done: step %d" % total in out
    second = checkpoint_values(tf.train.latest_checkpoint(logdir))
    assert second[SCHEDULE_TOTAL_STEPS] == total and second["global_step"] == total


# ------------------------------------------------------------------------------------------------
# A logdir written before schedules, --precision auto and the schedule's variable existed


@pytest.fixture
def v1_logdir(tmp_path):
    logdir = tmp_path / "v1_run"
    shutil.copytree(FIXTURE / "run", logdir)
    return str(logdir)


@pytest.mark.slow
def test_a_v1_checkpoint_resumes_on_the_noam_schedule_it_was_trained_with(data_dir, v1_logdir, capsys):
    assert not {"lr_schedule", "summary_every"} & set(json.load(open(os.path.join(v1_logdir, "hparams.json"))))
    before = checkpoint_values(os.path.join(v1_logdir, "E00_L5.21_B0.00-3"))
    assert SCHEDULE_TOTAL_STEPS not in before
    assert train.main(["--data_dir", data_dir, "--logdir", v1_logdir, "--max_steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 3" in out and "done: step 5" in out and "learning rate:" not in out
    after = checkpoint_values(tf.train.latest_checkpoint(v1_logdir))
    assert after["global_step"] == 5 and after[SCHEDULE_TOTAL_STEPS] == 0  # Noam has no end
    # The resumed run trained the restored weights, not fresh ones: they moved a little from the old values.
    name = "encoder/num_blocks_0/multihead_attention/q/kernel"
    assert 0 < np.abs(after[name] - before[name]).max() < 0.05
    hparams = json.load(open(os.path.join(v1_logdir, "hparams.json")))
    assert hparams["lr_schedule"] == "noam" and hparams["precision"] == "fp32" and hparams["summary_every"] == 100


def test_a_v1_checkpoint_is_tested_like_a_new_one(data_dir, v1_logdir, tmp_path, capsys):
    testdir = str(tmp_path / "test")
    assert test_cli.main(["--logdir", v1_logdir, "--data_dir", data_dir, "--testdir", testdir]) == 0
    results = json.load(open(os.path.join(testdir, "results.json")))
    assert results["sentences"] == 8 and results["checkpoint"].endswith("E00_L5.21_B0.00-3")


def test_a_v1_checkpoint_is_exported_and_averaged_like_a_new_one(data_dir, v1_logdir, tmp_path, capsys):
    """export.py and avg_checkpoints.py read the v1 hparams.json (without lr_schedule) as test.py does."""
    export_dir = str(tmp_path / "export")
    assert export.main(["--logdir", v1_logdir, "--data_dir", data_dir, "--export_dir", export_dir]) == 0
    assert "exported E00_L5.21_B0.00-3 (beam 1, alpha 0.6)" in capsys.readouterr().out
    assert avg_checkpoints.main(["--logdir", v1_logdir, "--last", "1"]) == 0
    assert tf.train.latest_checkpoint(v1_logdir).endswith("avg_last1-3")
