"""The two implementations end to end (--impl reference and fast): each trains, resumes the other's run from its
checkpoint, and decodes the same tokens from one checkpoint."""
import json
import os

import pytest

import test as test_cli
import train
from in_process import run_in_process

TINY_MODEL = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "1500",
              "--warmup_steps", "20", "--lr", "3e-3", "--test_batch_size", "100", "--seed", "7",
              "--precision", "fp32", "--eval_every", "100"]


def losses(out):
    """The training losses that train.py's progress lines print, in order."""
    return [float(line.split("| loss ")[1].split()[0]) for line in out.splitlines() if "| loss " in line]


def hypotheses(logdir, impl, testdir):
    """test.py's hypotheses of the logdir's latest checkpoint decoded by impl, and its results.json."""
    assert test_cli.main(["--logdir", logdir, "--impl", impl, "--testdir", testdir]) == 0
    with open(os.path.join(testdir, "hypotheses.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    with open(os.path.join(testdir, "results.json"), encoding="utf-8") as f:
        return lines, json.load(f)


@pytest.mark.slow
def test_a_run_trains_on_one_path_resumes_on_the_other_and_back_and_both_decode_alike(small_numbers_dir, tmp_path,
                                                                                     capsys):
    """reference trains steps 1-20, fast resumes for 21-40, reference again for 41-60: each path resumes the
    other's checkpoint (same variable names, same optimizer slots), and the loss goes on falling."""
    logdir = str(tmp_path / "run")
    assert train.main(["--data_dir", small_numbers_dir, "--logdir", logdir, "--max_steps", "20",
                       "--lr_schedule", "noam", "--impl", "reference"] + TINY_MODEL) == 0
    out = capsys.readouterr().out
    assert "done: step 20" in out
    first_losses = losses(out)
    assert json.load(open(os.path.join(logdir, "hparams.json")))["impl"] == "reference"

    for impl, start, end in (("fast", 20, 40), ("reference", 40, 60)):
        assert train.main(["--logdir", logdir, "--max_steps", str(end), "--impl", impl]) == 0
        out = capsys.readouterr().out
        assert "at step %d" % start in out and "done: step %d" % end in out
        assert losses(out)[-1] < first_losses[0]
        assert json.load(open(os.path.join(logdir, "hparams.json")))["impl"] == impl

    (reference, reference_results), (fast, fast_results) = (hypotheses(logdir, impl, str(tmp_path / impl))
                                                            for impl in ("reference", "fast"))
    assert reference_results["checkpoint"].endswith("-60") and len(reference) == 11
    assert reference == fast and reference_results["bleu"] == fast_results["bleu"]


def test_the_reference_path_computes_in_float32(small_numbers_dir, tmp_path, capsys):
    code, out, err = run_in_process(capsys, "train.py", train.main, "--data_dir", small_numbers_dir, "--logdir",
                                    str(tmp_path / "run"), "--max_steps", "1", "--impl", "reference",
                                    *TINY_MODEL[:-4], "--precision", "bf16", "--eval_every", "100")
    assert code == 0, err
    assert "--impl reference computes in float32" in err
    saved = json.load(open(os.path.join(tmp_path, "run", "hparams.json")))
    assert (saved["impl"], saved["precision"], saved["kernels"]) == ("reference", "fp32", "tf")
