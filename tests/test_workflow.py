"""End to end: prepro -> train (a few steps) -> resume -> test, as a user runs them."""
import json
import os

import pytest

import prepro
import test as test_cli
import train
import translate
from hparams import Hparams, parse_flags
from in_process import run_in_process

TINY_MODEL = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "1500",
              "--warmup_steps", "20", "--lr", "3e-3", "--test_batch_size", "100", "--seed", "7"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("numbers"))
    assert prepro.main(["--dataset", "numbers", "--n_train", "1500", "--n_eval", "40", "--n_test", "60",
                        "--vocab_size", "200", "--data_dir", path]) == 0
    return path


@pytest.mark.slow
def test_prepro_train_resume_test(data_dir, tmp_path, capsys):
    logdir = str(tmp_path / "run")
    assert train.main(["--data_dir", data_dir, "--logdir", logdir, "--max_steps", "12"] + TINY_MODEL) == 0
    first = capsys.readouterr().out
    assert "done: step 12" in first and "dev BLEU" in first
    saved = json.load(open(os.path.join(logdir, "hparams.json")))
    assert saved["d_model"] == 32 and saved["vocab_size"] == 200

    # Started again with only the logdir: the saved flags come back, and training goes on from step 12 (the linear
    # schedule ended at step 12: Noam, which has no end, goes on).
    assert train.main(["--logdir", logdir, "--max_steps", "20", "--lr_schedule", "noam"]) == 0
    second = capsys.readouterr().out
    assert "at step 12, epoch 1" in second and "done: step 20" in second

    testdir = str(tmp_path / "test")
    assert test_cli.main(["--logdir", logdir, "--testdir", testdir]) == 0
    results = json.load(open(os.path.join(testdir, "results.json")))
    assert set(results) >= {"bleu", "signature", "sentences", "checkpoint"}
    assert results["sentences"] == 60 and 0.0 <= results["bleu"] <= 100.0
    assert "nrefs:1|case:mixed" in results["signature"] and results["checkpoint"].endswith("-20")
    hypotheses = open(os.path.join(testdir, "hypotheses.txt"), encoding="utf-8").read().split("\n")
    assert len(hypotheses) == 61 and hypotheses[-1] == ""
    assert "BLEU = " in capsys.readouterr().out


@pytest.mark.slow
def test_changing_the_model_shape_of_a_logdir_is_refused(data_dir, tmp_path, capsys):
    logdir = str(tmp_path / "run")
    train.main(["--data_dir", data_dir, "--logdir", logdir, "--max_steps", "1", "--eval_every", "100"] + TINY_MODEL)
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", logdir, "--d_model", "64")
    assert code == 2 and "Traceback" not in err
    assert "--d_model 32 but this run asks for 64" in err


def test_every_flag_has_help(capsys):
    for action in Hparams().parser._actions:
        assert action.help and len(action.help) > 10, action.dest
    code, help_text, _ = run_in_process(capsys, "train.py", train.main, "--help")
    assert code == 0
    for group in ("data:", "model:", "training:", "decoding:", "testing:"):
        assert group in help_text


def test_explicit_flags_are_those_on_the_command_line_even_at_their_default():
    args, given = parse_flags(Hparams(prog="test").parser, ["--beam_size", "1", "--logdir=runs/x", "--truncate"])
    assert given == {"beam_size": 1, "logdir": "runs/x", "truncate": True}
    assert args.beam_size == 1 and args.d_model == 256 and args.truncate
    args, given = parse_flags(translate.build_parser(), ["eins", "--alpha", "0.5", "zwei"], intermixed=True)
    assert args.sentences == ["eins", "zwei"] and given["alpha"] == 0.5 and "beam_size" not in given


def test_the_dev_evaluation_writes_bleu_and_an_attention_image_of_the_first_batch(tiny_model):
    import tensorflow as tf
    logdir, _ = tiny_model
    values = {(event.step, value.tag): value for path in sorted(os.listdir(logdir)) if path.startswith("events.out")
              for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, path))
              for value in event.summary.value}
    image = values[(60, "eval_attention/image/0")].image
    assert (60, "dev_bleu") in values
    # one image of the first dev sentence's last-block attention: its translation's positions by its source's
    assert image.encoded_image_string.startswith(b"\x89PNG") and image.height > 1 and image.width > 1


def test_test_py_min_confidence_and_prefix_file(tiny_model, tmp_path, capsys):
    """test.py --min_confidence 1 drops every hypothesis (results.json counts them); --prefix_file starts each test
    line's translation with its prefix, an empty prefix line leaving it free; a wrong line count is one line."""
    logdir, data_dir = tiny_model
    testdir = str(tmp_path / "test")
    assert test_cli.main(["--logdir", logdir, "--testdir", testdir, "--min_confidence", "1"]) == 0
    results = json.load(open(os.path.join(testdir, "results.json")))
    hypotheses = open(os.path.join(testdir, "hypotheses.txt"), encoding="utf-8").read().splitlines()
    assert set(hypotheses) == {""} and results["dropped_below_min_confidence"] == results["sentences"] == 50
    assert "test line 1 has confidence" in capsys.readouterr().err

    assert test_cli.main(["--logdir", logdir, "--testdir", testdir]) == 0
    free = open(os.path.join(testdir, "hypotheses.txt"), encoding="utf-8").read().splitlines()
    assert json.load(open(os.path.join(testdir, "results.json")))["dropped_below_min_confidence"] == 0
    prefixes = tmp_path / "prefixes.txt"
    prefix = " ".join(free[1].split()[:2])
    prefixes.write_text("%s\n\n" % prefix + "\n" * 48, encoding="utf-8")
    assert test_cli.main(["--logdir", logdir, "--testdir", testdir, "--prefix_file", str(prefixes)]) == 0
    forced = open(os.path.join(testdir, "hypotheses.txt"), encoding="utf-8").read().splitlines()
    assert forced[0].startswith(prefix) and forced[1:] == free[1:]
    prefixes.write_text("%s\n" % prefix, encoding="utf-8")
    code, _, err = run_in_process(capsys, "test.py", test_cli.main, "--logdir", logdir, "--testdir", testdir,
                                  "--prefix_file", prefixes)
    assert code == 2 and err.count("\n") == 1
    assert "--prefix_file %s has 1 lines but the test source %s has 50" % (
        prefixes, os.path.join(data_dir, "test.1")) in err
