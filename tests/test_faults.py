"""Faults of a user's first week: damaged or mismatched data dirs, hand-edited hparams.json, paths that cannot be
written, OS errors on any path, closed pipes and signals, and flags that make no sense. Each ends in one line (or a
quiet end for a closed pipe) and loses no work.

The tools run in this process as their scripts run them (run_in_process) except where a signal or a pipe needs a
process of its own. Tests that change a model or data dir change a copy of the session's tiny model (conftest.py).
"""
import errno
import json
import re
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import avg_checkpoints
from toolkit.data import build
import export
import hparams
from toolkit.training import logdir as logdir_tools
from toolkit.translating import trained_model
import plot_attention
import prepro
import test as test_cli
import train
import translate
from toolkit.data.datadir import MANIFEST_NAME
from toolkit.base.errors import UserError
from model import ModelConfig
from in_process import run_in_process


ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--threads", "1",
              "--batch_size", "2000", "--test_batch_size", "256"]
TOOLS = {"train.py": train.main, "test.py": test_cli.main, "translate.py": translate.main, "export.py": export.main,
         "avg_checkpoints.py": avg_checkpoints.main, "prepro.py": prepro.main, "plot_attention.py": plot_attention.main}


def one_line(capsys, tool, *args):
    """Runs a tool in this process and returns its one error line, after checking exit code 2 and no traceback."""
    code, _, err = run_in_process(capsys, tool, TOOLS[tool], *args)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err)
    return errors[0]


@pytest.fixture
def model(tiny_model, tmp_path):
    """A copy of the session's tiny model and of its data dir, which the test may damage: (logdir, data_dir),
    with the copy's hparams.json pointing at the copied data dir."""
    logdir = shutil.copytree(tiny_model[0], tmp_path / "run")
    data_dir = shutil.copytree(tiny_model[1], tmp_path / "data")
    saved = json.loads((logdir / "hparams.json").read_text())
    (logdir / "hparams.json").write_text(json.dumps(dict(saved, data_dir=str(data_dir))))
    return logdir, data_dir


def fresh_train(data_dir, logdir, *flags):
    return ("train.py", "--data_dir", data_dir, "--logdir", logdir, *TINY_MODEL, "--max_steps", "2", *flags)


# ------------------------------------------------------------------------------------------------
# A data dir's files, checked before any work


def cut(path, lines):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:lines]))


def drop_last_offset(path):
    path.write_bytes(path.read_bytes()[:-8])


def ids_out_of_range(path):
    ids = np.fromfile(path, "<u2")
    ids[len(ids) // 2] = 300  # the vocabulary has 300 pieces: ids 0..299
    ids.tofile(path)


#: How a data dir gets damaged: (file, damage, the tool that finds it, what its line says).
DAMAGES = [
    ("eval.2", lambda path: cut(path, 40), "train.py", "eval split of {data} should have 50 lines in each file "
                                                       "(%s) but has: eval.1.offsets 50, eval.1 50, eval.2.offsets 50, "
                                                       "eval.2 40" % MANIFEST_NAME),
    ("eval.1", lambda path: cut(path, 49), "train.py", "eval.1 49"),
    ("eval.2.offsets", drop_last_offset, "train.py", "eval.2.offsets 49"),
    ("train.1.offsets", drop_last_offset, "train.py", "train.1.offsets 1999"),
    ("test.2", lambda path: cut(path, 10), "test.py", "test split of {data} should have 50 lines"),
    ("bpe.model", os.remove, "train.py", "{data}/bpe.model is missing"),
    ("bpe.model", os.remove, "test.py", "{data}/bpe.model is missing"),
    ("bpe.model", os.remove, "translate.py", "{data}/bpe.model is missing"),
    ("bpe.model", os.remove, "export.py", "{data}/bpe.model is missing"),
    ("bpe.model", lambda path: path.write_bytes(b"not a model"), "translate.py", "bpe.model is not a sentencepiece"),
    ("bpe.vocab", os.remove, "test.py", "{data}/bpe.vocab is missing"),
    ("train.1.ids", os.remove, "train.py", "{data}/train.1.ids is missing"),
    ("eval.2.offsets", os.remove, "train.py", "{data}/eval.2.offsets is missing"),
    ("test.1.ids", os.remove, "test.py", "{data}/test.1.ids is missing"),
    ("train.2.ids", ids_out_of_range, "train.py", "{data}/train.2.ids holds ids outside the vocabulary's 300 pieces"),
    ("test.1.ids", ids_out_of_range, "test.py", "{data}/test.1.ids holds ids outside the vocabulary's 300 pieces"),
]


@pytest.mark.parametrize("name, damage, tool, message", DAMAGES,
                         ids=["%s %s: %s" % (tool, name, message[:20]) for name, _, tool, message in DAMAGES])
def test_a_damaged_data_dir_is_one_line_naming_the_file_before_any_work(model, tmp_path, capsys, monkeypatch, name,
                                                                         damage, tool, message):
    logdir, data_dir = model
    damage(data_dir / name)
    # no graph is built, nothing is decoded or exported
    monkeypatch.setattr(train, "build_graph", None)
    monkeypatch.setattr(trained_model, "build_transformer", None)
    args = {"train.py": fresh_train(data_dir, tmp_path / "new")[1:], "test.py": ["--logdir", logdir],
            "translate.py": ["--logdir", logdir, "eins"],
            "export.py": ["--logdir", logdir, "--export_dir", tmp_path / "export"]}[tool]
    line = one_line(capsys, tool, *args)
    assert message.format(data=data_dir) in line
    assert line.endswith("the data dir is damaged; rebuild it with `python prepro.py --data_dir %s --force` and the "
                         "options it was built with" % data_dir), line
    assert not (tmp_path / "new").exists() and not (tmp_path / "export").exists()


def other_corpus_model(tmp_path):
    """The bpe.model of another numbers corpus with the same vocabulary size (300)."""
    assert prepro.main(["--n_train", "2000", "--n_eval", "5", "--n_test", "5", "--seed", "7", "--vocab_size", "300",
                        "--data_dir", str(tmp_path / "other")]) == 0
    return tmp_path / "other" / "bpe.model"


def test_a_swapped_bpe_model_is_refused_by_every_tool(model, tmp_path, capsys):
    logdir, data_dir = model
    shutil.copy(other_corpus_model(tmp_path), data_dir / "bpe.model")
    for tool, args in (("test.py", ["--logdir", logdir]), ("translate.py", ["--logdir", logdir, "eins"]),
                       ("export.py", ["--logdir", logdir, "--export_dir", tmp_path / "x"]),
                       ("train.py", ["--logdir", logdir, "--max_steps", "70"])):
        assert "%s does not hold the pieces of %s" % (data_dir / "bpe.model", data_dir / "bpe.vocab") in one_line(
            capsys, tool, *args)


def test_the_fingerprint_covers_the_sentencepiece_model_and_older_logdirs_keep_loading(model, tmp_path, capsys):
    logdir, data_dir = model
    saved = json.loads((logdir / "hparams.json").read_text())
    assert len(saved["bpe_sha256"]) == 64 and len(saved["vocab_sha256"]) == 64
    (logdir / "hparams.json").write_text(json.dumps(dict(saved, bpe_sha256="0" * 64)))
    line = one_line(capsys, "test.py", "--logdir", logdir)
    assert "the sentencepiece model (bpe.model) of %s is not the one the model in %s was trained with" % (
        data_dir, logdir) in line
    del saved["bpe_sha256"]  # a logdir written before the sentencepiece model was fingerprinted
    (logdir / "hparams.json").write_text(json.dumps(saved))
    code, out, err = run_in_process(capsys, "test.py", test_cli.main, "--logdir", logdir, "--testdir", tmp_path / "t")
    assert code == 0 and "BLEU = " in out, err


# ------------------------------------------------------------------------------------------------
# Training and evaluation lose nothing


def test_a_failing_dev_evaluation_saves_the_weights_first(model, capsys, monkeypatch):
    logdir, _ = model

    def failing_bleu(references, hypotheses):
        raise ValueError("sacrebleu failed")

    monkeypatch.setattr(train, "calc_bleu", failing_bleu)
    with pytest.raises(ValueError, match="sacrebleu failed"):
        train.main(["--logdir", str(logdir), "--max_steps", "62", "--lr_schedule", "noam"])
    assert tf.train.latest_checkpoint(str(logdir)).endswith("-62")
    assert "the dev evaluation failed; saved the weights of step 62 as %s" % tf.train.latest_checkpoint(
        str(logdir)) in capsys.readouterr().err


def test_an_interruption_before_the_first_step_saves_nothing(tiny_model, tmp_path, capsys, monkeypatch):
    real_enter = train.StopRequest.__enter__

    def signalled_at_once(self):
        real_enter(self)
        self.signal, self.signum = "SIGTERM", signal.SIGTERM
        return self

    monkeypatch.setattr(train.StopRequest, "__enter__", signalled_at_once)
    code, out, err = run_in_process(capsys, "train.py", train.main, *fresh_train(tiny_model[1], tmp_path / "run")[1:])
    assert code == 128 + signal.SIGTERM and "SIGTERM: stopped before the first step; nothing to save" in out, err
    assert not list((tmp_path / "run").glob("*.index")) and not (tmp_path / "run" / "checkpoint").exists()


def test_a_checkpoint_of_step_0_is_called_untrained(model, tmp_path, capsys):
    """Earlier versions saved interrupted-0 when stopped before the first step: its weights are random."""
    logdir, _ = model
    values = avg_checkpoints.average([tf.train.latest_checkpoint(str(logdir))])
    values["global_step"] = np.int64(0)
    ckpt = avg_checkpoints.write_checkpoint(values, str(logdir / "interrupted"), 0)
    avg_checkpoints.make_latest(str(logdir), ckpt)
    for tool, args in (("test.py", ["--logdir", logdir]), ("translate.py", ["--logdir", logdir, "eins"]),
                       ("export.py", ["--logdir", logdir, "--export_dir", tmp_path / "x"])):
        assert "%s holds untrained weights (global step 0" % ckpt in one_line(capsys, tool, *args)


# ------------------------------------------------------------------------------------------------
# Paths that cannot be written, refused before any work


def path_cases(logdir, data_dir, tmp):
    """(tool, arguments, what the line says) for each kind of path that cannot be written."""
    a_file = tmp / "a_file"
    a_file.write_text("x\n")
    decode = ["--logdir", logdir, "eins"]
    return [
        ("translate.py", [*decode, "--output", tmp / "missing" / "out.txt"], "its directory %s does not exist"
         % (tmp / "missing")),
        ("translate.py", [*decode, "--output", tmp], "--output %s is a directory: name a file" % tmp),
        ("translate.py", [*decode, "--output", a_file / "out.txt"], "its directory %s is a file" % a_file),
        ("translate.py", [*decode, "--plot_attention", a_file], "--plot_attention %s: %s is a file" % (a_file, a_file)),
        ("plot_attention.py", ["--logdir", logdir, "--dir", a_file / "x", "eins"], "--dir %s: %s, above"
         % (a_file / "x", a_file)),
        ("test.py", ["--logdir", logdir, "--testdir", a_file], "--testdir %s: %s is a file" % (a_file, a_file)),
        ("test.py", ["--logdir", logdir, "--testdir", a_file / "sub" / "dir"], "%s, above" % a_file),
        ("export.py", ["--logdir", logdir, "--export_dir", a_file], "--export_dir %s: %s is a file" % (a_file, a_file)),
        ("train.py", fresh_train(data_dir, a_file)[1:], "--logdir %s: %s is a file" % (a_file, a_file)),
        ("train.py", fresh_train(data_dir, a_file / "run")[1:], "--logdir %s: %s, above" % (a_file / "run", a_file)),
        ("train.py", fresh_train(a_file, tmp / "run")[1:], "--data_dir %s is a file, not a directory: pass the "
                                                           "directory that prepro.py wrote" % a_file),
    ]


def test_paths_that_cannot_be_written_are_refused_before_any_work(model, tmp_path, capsys, monkeypatch):
    logdir, data_dir = model
    # no graph is built, nothing is decoded or exported
    monkeypatch.setattr(train, "build_graph", None)
    monkeypatch.setattr(trained_model, "build_transformer", None)
    tmp = tmp_path / "paths"
    tmp.mkdir()
    for tool, args, message in path_cases(logdir, data_dir, tmp):
        assert message in one_line(capsys, tool, *args), (tool, args)
    assert sorted(os.listdir(tmp)) == ["a_file"]


# ------------------------------------------------------------------------------------------------
# OS errors on any path: one line naming the path, in errors.run_cli for every tool


def fail_under(monkeypatch, directory, error_number):
    """Makes every open of a file under `directory` (Python's open, os.open, mkdir, TensorFlow's file writes are
    not covered) fail with OSError error_number naming the file: a read-only file system, a permission, a full
    disk, ... that the tests, running as root without mounts of their own, cannot make for real."""
    directory = os.path.abspath(directory)
    real_open, real_os_open, real_mkdir = open, os.open, os.mkdir

    def failing(real):
        def call(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(directory + os.sep):
                raise OSError(error_number, os.strerror(error_number), str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr("builtins.open", failing(real_open))
    monkeypatch.setattr(os, "open", failing(real_os_open))
    monkeypatch.setattr(os, "mkdir", failing(real_mkdir))


OS_ERRORS = [errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EIO, errno.ENOENT]


@pytest.mark.parametrize("error_number", OS_ERRORS, ids=[errno.errorcode[number] for number in OS_ERRORS])
def test_os_errors_on_the_paths_of_every_tool_are_one_line_naming_the_path(model, tmp_path, capsys, monkeypatch,
                                                                            error_number):
    logdir, data_dir = model
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.1", "train.2", "eval.1", "eval.2", "test.1", "test.2"):
        shutil.copy(data_dir / name, corpus / name)
    files = [arg for name in ("train1", "train2", "eval1", "eval2", "test1", "test2")
             for arg in ("--" + name, corpus / (name[:-1] + "." + name[-1]))]
    cases = [  # (tool, arguments, the directory whose files fail)
        ("train.py", ["--logdir", logdir, "--max_steps", "70"], logdir),
        ("train.py", fresh_train(data_dir, tmp_path / "new")[1:], data_dir),
        ("test.py", ["--logdir", logdir], logdir),
        ("test.py", ["--logdir", logdir, "--testdir", tmp_path / "t"], data_dir),
        ("translate.py", ["--logdir", logdir, "eins"], logdir),
        ("translate.py", ["--logdir", logdir, "--input", corpus / "test.1"], corpus),
        ("export.py", ["--logdir", logdir, "--export_dir", tmp_path / "x"], data_dir),
        ("avg_checkpoints.py", ["--logdir", logdir, "--last", "1"], logdir),
        ("prepro.py", ["--dataset", "files", *files, "--data_dir", tmp_path / "p"], tmp_path / "p"),
        ("prepro.py", ["--dataset", "files", *files, "--data_dir", tmp_path / "q"], corpus),
    ]
    for tool, args, failing_dir in cases:
        with monkeypatch.context() as patch:
            fail_under(patch, failing_dir, error_number)
            line = one_line(capsys, tool, *args)
        assert str(failing_dir) in line, (tool, line)


def test_real_path_errors_are_one_line_naming_the_path(model, tmp_path, capsys):
    """Missing files, a file where a directory belongs and a directory where a file belongs, for real."""
    logdir, data_dir = model
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    cases = [
        ("test.py", ["--logdir", tmp_path / "nowhere"], "%s not found" % (tmp_path / "nowhere" / "hparams.json")),
        ("test.py", ["--logdir", a_file / "run"], str(a_file / "run")),
        ("translate.py", ["--logdir", logdir, "--input", tmp_path / "none.txt"], str(tmp_path / "none.txt")),
        ("translate.py", ["--logdir", logdir, "--input", tmp_path], str(tmp_path)),
        ("translate.py", ["--engine", "ctranslate2", "--model", a_file, "eins"], str(a_file)),
        ("avg_checkpoints.py", ["--logdir", a_file, "--last", "1"], str(a_file)),
        ("export.py", ["--logdir", logdir, "--export_dir", tmp_path / "x", "--data_dir", a_file], str(a_file)),
        ("prepro.py", ["--n_train", "50", "--data_dir", a_file], str(a_file)),
        ("prepro.py", ["--n_train", "50", "--data_dir", a_file / "d"], str(a_file)),
    ]
    for tool, args, message in cases:
        assert message in one_line(capsys, tool, *args), (tool, args)


@pytest.mark.parametrize("error_number", [errno.EACCES, errno.EROFS], ids=["EACCES", "EROFS"])
def test_tensorflow_file_errors_are_one_line_naming_the_path(model, capsys, monkeypatch, error_number):
    """TensorFlow's file operations raise OpErrors with the C library's message, no errno: the Saver fails here as
    it does on a logdir that became read-only, or lost its permissions, during training."""
    logdir, _ = model

    def failing_save(saver, sess, prefix, global_step, **kwargs):
        raise tf.errors.PermissionDeniedError(None, None, "%s-62.index.tempstate1; %s" % (prefix, os.strerror(
            error_number)))

    monkeypatch.setattr(tf.compat.v1.train.Saver, "save", failing_save)
    line = one_line(capsys, "train.py", "--logdir", logdir, "--max_steps", "62", "--lr_schedule", "noam")
    assert line.startswith("error: %s" % (logdir / "E04_L")) and os.strerror(error_number) in line
    assert "the path is " in line and "pass a" in line
    from toolkit.base.errors import error_line
    assert error_line(tf.errors.InvalidArgumentError(None, None, "indices out of range")) is None  # a bug: traceback


def test_os_error_lines_say_what_to_do():
    from toolkit.base.errors import os_error_line
    for number, phrase in ((errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
                           (errno.ENOTDIR, "a file where a directory belongs"), (errno.EISDIR, "is a directory"),
                           (errno.ENOENT, "does not exist"), (errno.ENOSPC, "no space left on the device")):
        assert phrase in os_error_line(OSError(number, os.strerror(number), "/some/path")), number


def unshare_available():
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not unshare_available(), reason="needs unshare -rm (user and mount namespaces)")
def test_a_read_only_logdir_and_data_dir_are_one_line(model, tmp_path):
    """A real read-only bind mount (EROFS) in a private mount namespace: train.py, test.py, avg_checkpoints.py and
    export.py over a read-only logdir, train.py on a new logdir over a read-only data dir."""
    logdir, data_dir = model
    script = ROOT / "tests" / "read_only_tools.py"
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && mount --bind "$2" '
         '"$2" && mount -o remount,ro,bind "$2" && exec "$3" "$4" "$1" "$2" "$5"', "sh", str(logdir), str(data_dir),
         sys.executable, str(script), str(tmp_path / "new")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = json.loads(result.stdout.strip().splitlines()[-1])
    assert lines["train.py"] == "error: --logdir %s: cannot write in %s (Read-only file system); pass a path where " \
                                "files can be written" % (logdir, logdir)
    assert lines["test.py"].startswith("error: --testdir %s: cannot write in %s (Read-only" % (logdir / "test", logdir))
    assert lines["avg_checkpoints.py"] == "error: --logdir %s: cannot write in %s (Read-only file system); pass a " \
                                          "path where files can be written" % (logdir, logdir)
    assert lines["test.py --testdir elsewhere"] == "ok"  # reading a read-only logdir and data dir is fine
    assert lines["export.py from a read-only logdir"] == "ok"
    assert lines["train.py over a read-only data dir"] == "ok"


# ------------------------------------------------------------------------------------------------
# Pipes and signals


def test_a_closed_pipe_ends_the_tool_quietly(model):
    """`translate.py ... | head -1`, with the reader gone before the first line: no traceback, exit 141 as cat."""
    logdir, _ = model
    process = subprocess.Popen([sys.executable, "translate.py", "--logdir", logdir, "eins", "zwei", "drei"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE and "Traceback" not in err and "Error" not in err, err


def test_sigterm_during_translate_output_keeps_the_old_file(model, tmp_path):
    logdir, _ = model
    output = tmp_path / "out" / "out.txt"
    output.parent.mkdir()
    output.write_text("the old translations\n")
    process = subprocess.Popen([sys.executable, "translate.py", "--logdir", logdir, "--output", output], cwd=ROOT,
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        process.stdin.write("eins\n")
        process.stdin.flush()
        deadline = time.time() + 120
        while not list(output.parent.glob(".out.txt.*.tmp")):  # translating into the file beside the output
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                pytest.fail("translate.py wrote no file beside %s: %s" % (output, process.stderr.read()))
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        process.kill()
    assert output.read_text() == "the old translations\n" and os.listdir(output.parent) == ["out.txt"]
    assert "Traceback" not in process.stderr.read()


# ------------------------------------------------------------------------------------------------
# Flags and hparams.json


def float_flags(parser):
    return [action.option_strings[0] for action in parser._actions if action.type is float]


def test_every_float_flag_of_every_tool_refuses_nan_and_infinity(model, tmp_path, capsys):
    logdir, data_dir = model
    parsers = {"train.py": hparams.Hparams().parser, "test.py": hparams.Hparams(hparams.DECODING_FLAGS).parser,
               "translate.py": translate.build_parser(), "export.py": export.build_parser(),
               "prepro.py": prepro.build_parser()}
    base = {"train.py": fresh_train(data_dir, tmp_path / "new")[1:], "test.py": ["--logdir", logdir],
            "translate.py": ["--logdir", logdir, "eins"],
            "export.py": ["--logdir", logdir, "--export_dir", tmp_path / "x"],
            "prepro.py": ["--n_train", "50", "--data_dir", tmp_path / "p"]}
    tried = 0
    for tool, parser in parsers.items():
        for flag in float_flags(parser):
            for value in ("nan", "inf", "-inf"):
                line = one_line(capsys, tool, *base[tool], "%s=%s" % (flag, value))
                assert "%s %s is out of range" % (flag, float(value)) in line, (tool, flag, line)
                tried += 1
    assert tried >= 3 * 10 and not (tmp_path / "new").exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("seed", ["-1", str(2 ** 32), str(2 ** 70)])
def test_a_seed_outside_numpys_range_is_refused_before_anything_is_written(tiny_model, tmp_path, capsys, seed):
    line = one_line(capsys, *fresh_train(tiny_model[1], tmp_path / "run", "--seed", seed))
    assert "--seed %s is out of range: it must be from 0 to 2^32 - 1" % seed in line
    assert not (tmp_path / "run").exists()
    assert "--seed %s is out of range" % seed in one_line(capsys, "prepro.py", "--seed", seed, "--data_dir",
                                                          tmp_path / "p")


#: Hand edits of hparams.json and the phrase of the line about each.
EDITS = [
    ({"d_model": "32"}, 'd_model is "32" but must be an integer'),
    ({"lr": None}, "lr is null but must be a number"),
    ({"beam_size": 1.5}, "beam_size is 1.5 but must be an integer"),
    ({"truncate": "yes"}, 'truncate is "yes" but must be true or false'),
    ({"d_ff": True}, "d_ff is true but must be an integer"),
    ({"alpha": [0.6]}, "alpha is [0.6] but must be a number"),
    ({"norm_type": "mid"}, 'norm_type is "mid" but must be one of post, pre'),
    ({"vocab_size": "300"}, 'vocab_size is "300" but must be an integer'),
    ({"bpe_sha256": 1}, "bpe_sha256 is 1 but must be a string or null"),
    ({"data_dir": 5}, "data_dir is 5 but must be a string"),
    ({"dropout_rate": 2}, "dropout_rate is 2, out of range: it must be at least 0 and below 1"),
    ({"attention_dropout": "0.1"}, 'attention_dropout is "0.1" but must be a number or null'),
    ({"attention_dropout": 1.5}, "attention_dropout is 1.5, out of range: it must be at least 0 and below 1"),
    ({"relu_dropout": -0.1}, "relu_dropout is -0.1, out of range: it must be at least 0 and below 1"),
    ({"seed": -3}, "seed is -3, out of range"),
]


@pytest.mark.parametrize("edit, phrase", EDITS, ids=[json.dumps(edit) for edit, _ in EDITS])
def test_a_hand_edited_hparams_json_is_one_line_naming_the_file_and_key(tiny_model, tmp_path, capsys, edit, phrase):
    logdir = tmp_path / "run"
    logdir.mkdir()
    saved = json.loads((Path(tiny_model[0]) / "hparams.json").read_text())
    (logdir / "hparams.json").write_text(json.dumps({**saved, **edit}))
    for tool, args in (("train.py", ["--logdir", logdir]), ("test.py", ["--logdir", logdir]),
                       ("translate.py", ["--logdir", logdir, "eins"])):
        assert "%s: %s" % (logdir / "hparams.json", phrase) in one_line(capsys, tool, *args), tool


def restored_config(tiny_model, tmp_path, key, saved_value, given, **saved_edits):
    """The ModelConfig that a logdir restores whose hparams.json is the tiny model's with saved_edits and `key` set to
    saved_value (or left out: "absent"), when the command line gives `given`."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    saved = {**json.loads((Path(tiny_model[0]) / "hparams.json").read_text()), **saved_edits}
    saved.pop(key, None)
    if saved_value != "absent":
        saved[key] = saved_value
    (logdir / "hparams.json").write_text(json.dumps(saved))
    hp = logdir_tools.load_trained_hparams(str(logdir), hparams.parse_flags(hparams.Hparams().parser, given)[1])
    return ModelConfig.from_flags(hp)


@pytest.mark.parametrize("saved_value, given, expected", [("absent", [], 0.3), (None, [], 0.3), (0.05, [], 0.05),
                                                           (None, ["--attention_dropout", "0.1"], 0.1)])
def test_attention_dropout_not_given_or_from_before_the_flag_is_the_dropout_rate(tiny_model, tmp_path, saved_value,
                                                                                 given, expected):
    config = restored_config(tiny_model, tmp_path, "attention_dropout", saved_value, given, dropout_rate=0.3)
    assert config.attention_dropout == expected


@pytest.mark.parametrize("saved_value, given, expected", [("absent", [], 0.0), (0.1, [], 0.1),
                                                           (0.1, ["--relu_dropout", "0.2"], 0.2)])
def test_relu_dropout_from_before_the_flag_is_zero(tiny_model, tmp_path, saved_value, given, expected):
    assert restored_config(tiny_model, tmp_path, "relu_dropout", saved_value, given).relu_dropout == expected


def test_export_refuses_a_quantization_the_savedmodel_would_ignore(tiny_model, tmp_path, capsys):
    line = one_line(capsys, "export.py", "--logdir", tiny_model[0], "--export_dir", tmp_path / "x", "--quantization",
                    "int8")
    assert "--quantization int8 applies to --format ctranslate2 or argos only" in line and not (tmp_path / "x").exists()


def test_exports_suggested_command_quotes_its_path(tiny_model, tmp_path, capsys):
    export_dir = tmp_path / "my exports" / "it's here"
    code, out, err = run_in_process(capsys, "export.py", export.main, "--logdir", tiny_model[0], "--export_dir",
                                    export_dir)
    assert code == 0, err
    assert out.strip().endswith("try: python scripts/serve_example.py '%s' \"a sentence\"" % str(export_dir).replace(
        "'", "'\"'\"'")), out


def test_plot_attention_has_a_command_line(tiny_model, tmp_path, capsys):
    code, out, _ = run_in_process(capsys, "plot_attention.py", plot_attention.main, "--help")
    assert code == 0 and "--logdir" in out and "SENTENCE" in out
    assert "required" in one_line(capsys, "plot_attention.py")
    # in a process of its own, as a user runs it: it starts TensorFlow's graph mode itself
    done = subprocess.run([sys.executable, "plot_attention.py", "--logdir", tiny_model[0], "--dir",
                           tmp_path / "plots", "eins", "zwei"], cwd=os.path.dirname(os.path.dirname(__file__)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2, done.stderr
    assert sorted(os.listdir(tmp_path / "plots")) == ["0001.png", "0002.png", "positional_encoding.png"]


def test_a_non_finite_loss_before_any_checkpoint_says_none_was_saved(tiny_model, tmp_path, capsys):
    line = one_line(capsys, *fresh_train(tiny_model[1], tmp_path / "run", "--lr", "1e30", "--max_steps", "30",
                                         "--lr_schedule", "noam", "--warmup_steps", "1"))
    assert "the last good checkpoint is none: no checkpoint was saved yet." in line and "None" not in line


# ------------------------------------------------------------------------------------------------
# prepro: inputs that make no sense


def corpus_files(folder, pairs, **splits):
    """Writes a --dataset files corpus: `pairs` for every split unless given in splits. Returns prepro arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    args = ["--dataset", "files"]
    for split in ("train", "eval", "test"):
        for side in (1, 2):
            path = folder / ("%s.%d" % (split, side))
            path.write_text("".join(pair[side - 1] + "\n" for pair in splits.get(split, pairs)))
            args += ["--%s%d" % (split, side), path]
    return args


NUMBERS = list(zip(*prepro.numbers_corpus(300, 1, 1, seed=1)["train"]))


@pytest.mark.parametrize("split, name", [("eval", "dev"), ("test", "test")])
def test_prepro_refuses_a_dev_or_test_split_of_blank_lines(tmp_path, capsys, split, name):
    blank = [("", ""), ("  ", "\t"), ("eins", ""), ("", "one")]  # blank lines, and pairs with one blank side
    args = corpus_files(tmp_path / "in", NUMBERS, **{split: blank})
    code, _, err = run_in_process(capsys, "prepro.py", prepro.main, *args, "--vocab_size", "100", "--data_dir",
                                  tmp_path / "data")
    assert code == 2 and "every pair of the %s split has a blank side" % name in err
    assert not (tmp_path / "data" / MANIFEST_NAME).exists()


def test_prepro_warns_when_the_target_repeats_the_source(tmp_path, capsys):
    same = [(source, source) for source, _ in NUMBERS]
    mostly = [(source, source if i % 4 else target) for i, (source, target) in enumerate(NUMBERS)]
    for pairs, split in ((same, "train"), (mostly, "eval")):
        args = corpus_files(tmp_path / split, NUMBERS, **{split: pairs})
        code, out, _ = run_in_process(capsys, "prepro.py", prepro.main, *args, "--vocab_size", "100", "--data_dir",
                                      tmp_path / ("data_" + split))
        assert code == 0
        assert "warning: the target is identical to the source in %d of the 300 %s pairs" % (
            sum(a == b for a, b in pairs), split) in out
    code, out, _ = run_in_process(capsys, "prepro.py", prepro.main, *corpus_files(tmp_path / "fine", NUMBERS),
                                  "--vocab_size", "100", "--data_dir", tmp_path / "fine_data")
    assert code == 0 and "warning" not in out


@pytest.mark.parametrize("vocab_size", ["1", "3", "4", "0", "-2"])
def test_prepro_refuses_a_vocabulary_without_room_for_text(tmp_path, capsys, vocab_size):
    line = one_line(capsys, "prepro.py", "--vocab_size", vocab_size, "--data_dir", tmp_path / "data")
    assert "--vocab_size %s is too small: the 4 special pieces" % vocab_size in line and "INTERNAL" not in line



# ------------------------------------------------------------------------------------------------
# Outputs never replace what is not theirs (toolkit.base.writing.output_target)


def read_in_thread(path_or_fd, chunks):
    """A started thread that reads a FIFO (path) or a pipe's end (fd) to its end into chunks."""
    def read():
        with open(path_or_fd, "rb") as reader:
            chunks.append(reader.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_outputs_follow_links_and_write_devices_fifos_and_pipes_in_place(tiny_model, tmp_path, capsys):
    logdir = tiny_model[0]
    code, expected, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "eins", "zwei")
    assert code == 0 and len(expected.splitlines()) == 2, err

    def translate_to(output):
        code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "eins", "zwei",
                                        "--output", output)
        assert code == 0 and out == "" and "Traceback" not in err, err

    translate_to("/dev/null")
    assert os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode)

    fifo, chunks = tmp_path / "fifo", []
    os.mkfifo(fifo)
    reader = read_in_thread(fifo, chunks)
    translate_to(fifo)
    reader.join(timeout=60)
    assert chunks == [expected.encode()] and stat.S_ISFIFO(os.stat(fifo).st_mode)

    read_end, write_end = os.pipe()  # what a shell's >(cat) hands over: /dev/fd/N
    reader = read_in_thread(read_end, chunks)
    translate_to("/dev/fd/%d" % write_end)
    os.close(write_end)
    reader.join(timeout=60)
    assert chunks[1] == expected.encode()

    target, link = tmp_path / "kept" / "target.txt", tmp_path / "link.txt"
    target.parent.mkdir()
    target.write_text("old\n")
    target.chmod(0o640)
    link.symlink_to(target)
    translate_to(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == expected and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["fifo", "kept", "link.txt"] and os.listdir(target.parent) == [
        "target.txt"]


def test_an_input_is_never_an_output(tiny_model, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text("eins\n")
    (tmp_path / "alias.txt").symlink_to(source)
    line = one_line(capsys, "translate.py", "--logdir", tiny_model[0], "--input", source, "--output",
                    tmp_path / "alias.txt")
    assert "--output %s is the file given as --input %s" % (tmp_path / "alias.txt", source) in line
    data_dir = tmp_path / "data"
    args = corpus_files(data_dir, NUMBERS)  # the corpus's train.1 ... test.2 inside --data_dir itself
    before = {path.name: path.read_bytes() for path in data_dir.iterdir()}
    line = one_line(capsys, "prepro.py", *args, "--vocab_size", "100", "--data_dir", data_dir)
    assert "--train1 %s is %s, a file that prepro.py writes in --data_dir %s" % (
        data_dir / "train.1", data_dir / "train.1", data_dir) in line
    assert {path.name: path.read_bytes() for path in data_dir.iterdir()} == before
    assert source.read_text() == "eins\n"


# ------------------------------------------------------------------------------------------------
# Metadata is checked


@pytest.mark.parametrize("key, name", [("bpe_model", "/etc/passwd"), ("raw2", "../../outside.txt"),
                                       ("ids1", "sub/test.1.ids"), ("bpe_vocab", 7)])
def test_manifest_paths_outside_the_data_dir_are_refused(model, capsys, key, name):
    logdir, data_dir = model
    manifest = json.loads((data_dir / MANIFEST_NAME).read_text())
    entry = manifest if key.startswith("bpe_") else manifest["splits"]["test"]
    entry[key] = name
    (data_dir / MANIFEST_NAME).write_text(json.dumps(manifest))
    where = key if key.startswith("bpe_") else "splits.test." + key
    line = one_line(capsys, "test.py", "--logdir", logdir)
    assert "%s: %s is %s, not the name of a file inside %s" % (data_dir / MANIFEST_NAME, where, json.dumps(name),
                                                              data_dir) in line


def test_a_data_dir_rebuilt_under_a_model_says_so(model, tmp_path, capsys):
    logdir, data_dir = model
    assert prepro.main(["--n_train", "300", "--n_eval", "5", "--n_test", "5", "--vocab_size", "120", "--data_dir",
                        str(data_dir), "--force"]) == 0
    line = one_line(capsys, "test.py", "--logdir", logdir)
    assert "%s is the data dir it was trained on, rebuilt since (prepro.py --force) with another vocabulary: the " \
           "model's vocabulary is gone" % data_dir in line


# ------------------------------------------------------------------------------------------------
# Errors of the libraries underneath are one line, by what the tool was doing and on which path


def test_a_truncated_checkpoint_is_one_line_for_avg_checkpoints(model, capsys):
    logdir, _ = model
    ckpt = tf.train.latest_checkpoint(str(logdir))
    data = Path(ckpt + ".data-00000-of-00001")
    os.truncate(data, data.stat().st_size // 2)
    line = one_line(capsys, "avg_checkpoints.py", "--logdir", logdir, "--last", "1")
    assert "cannot read checkpoint %s (" % ckpt in line and "it is damaged" in line
    assert not list(logdir.glob("avg_*"))


def test_a_full_disk_names_the_path_and_its_disks_free_space(model, tmp_path, capsys, monkeypatch):
    from toolkit.base.errors import os_error_line, writing
    with pytest.raises(UserError) as error, writing(tmp_path / "out", "the output"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write() names no file
    assert re.fullmatch(r"no space left on the device while writing the output \([\d.]+ MB free on %s\)"
                        % re.escape(str(tmp_path)), str(error.value))
    assert os_error_line(OSError(errno.ENOSPC, "x")) == ("no space left on the device: free some space and run the "
                                                         "same command again")  # never another disk's free space
    logdir, _ = model

    def save_on_a_full_disk(saver, sess, prefix, global_step, **kwargs):
        Path("%s-%d.data-00000-of-00001.tempstate99" % (prefix, global_step)).write_bytes(b"half")
        raise tf.errors.ResourceExhaustedError(None, None, "Graph execution error:\n\nDetected at node save/Save\n"
                                                           "%s_temp/part-00000; No space left on device" % prefix)

    monkeypatch.setattr(tf.compat.v1.train.Saver, "save", save_on_a_full_disk)
    before = sorted(os.listdir(logdir))
    line = one_line(capsys, "avg_checkpoints.py", "--logdir", logdir, "--last", "1")
    assert re.fullmatch(r"error: no space left on the device while writing the checkpoint avg_last1-60 \([\d.]+ MB "
                        r"free on %s\)" % re.escape(str(logdir)), line), line
    assert sorted(os.listdir(logdir)) == before


def test_closed_standard_input_bad_bytes_and_byte_order_marks_in_arguments(tiny_model, tmp_path, capsys):
    logdir = tiny_model[0]
    result = subprocess.run([sys.executable, "translate.py", "--logdir", logdir], cwd=ROOT, capture_output=True,
                            text=True, preexec_fn=lambda: os.close(0), timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and "Traceback" not in result.stderr and errors == [
        "error: standard input is closed and no sentences are given: give sentences as arguments, --input FILE, or "
        "text on standard input"], result.stderr
    result = subprocess.run([sys.executable, "translate.py", "--logdir", logdir, "eins"], cwd=ROOT, stdout=None,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == "error: standard output is closed: pass --output " \
                                                               "FILE, or let the translations go to standard output"
    bad = os.fsdecode(b"zw\xffei")  # how Python hands over an argument that is not UTF-8
    for tool, args in (("translate.py", ["--logdir", logdir, "eins", bad]),
                       ("prepro.py", ["--data_dir", bad])):
        assert "is not valid UTF-8 (byte 0xff at byte column 3)" in one_line(capsys, tool, *args), tool
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "eins",
                                    "\ufeffeins", "ei\ufeffns")
    assert code == 0 and len(set(out.splitlines())) == 1 and "<unk>" not in err and "vocabulary" not in err, (out,
                                                                                                             err)


def test_a_read_only_checkout_falls_back_to_tensorflows_ops(tmp_path, monkeypatch):
    from fast import kernels
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    monkeypatch.setattr(kernels, "BUILD_DIR", str(a_file / "build"))  # as unwritable as a read-only checkout
    kernels.load.cache_clear()
    try:
        choice, note = kernels.choose_kernels("auto", has_gpu=False)
    finally:
        kernels.load.cache_clear()
    assert choice == "tf" and note == ("kernels auto: TensorFlow's ops (the fused CPU kernels are unavailable: cannot "
                                       "write the build in %s (Not a directory))" % (a_file / "build"))


def test_a_lost_worker_is_one_line():
    from toolkit.base.errors import error_line
    line = error_line(tf.errors.UnavailableError(None, None, "Graph execution error:\n\nDetected at node 'x' defined "
                                                             "at (most recent call last):\n  File \"train.py\"\n"
                                                             "Collective ops is aborted by: Socket closed\nmore"))
    assert line == ("another worker of the cluster is gone (Collective ops is aborted by: Socket closed): the chief's "
                    "last checkpoint is intact; restart every worker with the same command to resume from it")


# ------------------------------------------------------------------------------------------------
# One mechanism for staging, what killed runs left, and locks (toolkit.base.writing, toolkit.base.writing)


def dead_pid():
    """A process id that no process has (above the kernel's largest)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_what_killed_runs_left_is_removed_by_the_next_run(model, tmp_path, capsys):
    from toolkit.base.writing import atomic_write
    logdir, _ = model
    dead, live = dead_pid(), os.getpid()
    (logdir / "avg_last1-60.data-00000-of-00001.tempstate123").write_bytes(b"half")  # a killed save's
    code, _, err = run_in_process(capsys, "avg_checkpoints.py", avg_checkpoints.main, "--logdir", logdir, "--last",
                                  "1")
    assert code == 0 and not list(logdir.glob("*.tempstate*")) and (logdir / "avg_last1-60.index").exists(), err
    exports = tmp_path / "exports"
    for pid in (dead, live):
        (exports / (".tmp-export-%d-x" % pid) / "model").mkdir(parents=True)
    (exports / "model").mkdir()
    (tmp_path / "link").symlink_to(exports / "model")  # an --export_dir given through a link: followed
    code, _, err = run_in_process(capsys, "export.py", export.main, "--logdir", logdir, "--export_dir",
                                  tmp_path / "link")
    assert code == 0, err
    assert sorted(os.listdir(exports)) == [".tmp-export-%d-x" % live, "model"]
    assert (tmp_path / "link").is_symlink() and (exports / "model" / "saved_model.pb").exists()
    for pid in (dead, live):
        (tmp_path / (".out.txt.%d.abc.tmp" % pid)).write_text("half")
    atomic_write(tmp_path / "out.txt", "whole\n")
    assert sorted(name for name in os.listdir(tmp_path) if "out.txt" in name) == [".out.txt.%d.abc.tmp" % live,
                                                                                 "out.txt"]


def test_sigterm_during_a_build_ends_prepro_with_143_and_no_staging(tmp_path, capsys, monkeypatch):
    from toolkit.base.cli import Terminated

    def terminated(*args, **kwargs):
        raise Terminated()

    monkeypatch.setattr(build, "write_bpe_model", terminated)
    code, _, err = run_in_process(capsys, "prepro.py", prepro.main, "--n_train", "50", "--data_dir", tmp_path / "d")
    assert code == 128 + signal.SIGTERM and "interrupted" in err and os.listdir(tmp_path / "d") == [], err


def test_a_second_prepro_on_a_data_dir_being_built_is_refused(tmp_path, capsys):
    from toolkit.data.datadir import staging_dir
    data = tmp_path / "data"
    data.mkdir()
    with staging_dir(data) as staging:  # another prepro.py building it
        (staging / "train.1").write_text("being written\n")
        line = one_line(capsys, "prepro.py", "--n_train", "50", "--n_eval", "5", "--n_test", "5", "--vocab_size",
                        "60", "--data_dir", data)
        assert line == "error: %s is being built by another prepro.py: wait for it to end, stop it, or pass another " \
                       "--data_dir" % data
        assert (staging / "train.1").read_text() == "being written\n"
    assert prepro.main(["--n_train", "50", "--n_eval", "5", "--n_test", "5", "--vocab_size", "60", "--data_dir",
                        str(data)]) == 0
    assert not list(data.glob(".build-*"))


def test_how_each_kind_of_output_path_is_written(tmp_path):
    from toolkit.base.writing import output_target
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "new" / "target")
    os.mkfifo(tmp_path / "fifo")
    read_end, write_end = os.pipe()
    try:
        assert output_target(tmp_path / "file") == (str(tmp_path / "file"), True)
        assert output_target(tmp_path / "link") == (str(tmp_path / "file"), True)
        assert output_target(tmp_path / "dangling") == (str(tmp_path / "new" / "target"), True)
        assert output_target(tmp_path / "none") == (str(tmp_path / "none"), True)
        for path in (tmp_path / "fifo", "/dev/null", "/dev/fd/%d" % write_end, "/proc/self/fd/%d" % write_end):
            assert output_target(path) == (str(path), False), path
        handle = os.open(tmp_path / "file", os.O_WRONLY)  # /dev/fd/N of a regular file: the opener's, not replaced
        assert output_target("/dev/fd/%d" % handle) == ("/dev/fd/%d" % handle, False)
        os.close(handle)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_translate_output_dev_stdout_writes_standard_output(tiny_model, capfd):
    code, out, err = run_in_process(capfd, "translate.py", translate.main, "--logdir", tiny_model[0], "eins",
                                    "--output", "/dev/stdout")
    assert code == 0 and len(out.splitlines()) == 1 and os.path.islink("/dev/stdout"), err
