"""Training budgets: the decaying learning-rate schedule's end step, --precision auto, and logdirs written before
either existed."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import avg_checkpoints
from toolkit.training import stopping
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
def test_a_time_budget_is_fixed_once_and_a_resumed_run_ends_at_the_same_step(data_dir, tmp_path, capsys):
    logdir = str(tmp_path / "run")
    args = ["--data_dir", data_dir, "--logdir", logdir, "--max_minutes", "0.25", "--warmup_steps", "10",
            "--num_epochs", "100000", "--eval_every", "0"] + TINY_MODEL
    assert train.main(args) == 0
    out = capsys.readouterr().out
    total = int(out.split("learning rate: linear decay to 0 at step ")[1].split()[0])
    first = checkpoint_values(tf.train.latest_checkpoint(logdir))
    # The total came from the rate measured after warm-up and 100 timed steps, to end at the deadline.
    assert first[SCHEDULE_TOTAL_STEPS] == total > 110
    assert 0.6 * total <= first["global_step"] <= total

    assert train.main(args) == 0  # the same command again: it goes on along the saved schedule to its end
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
