"""Reliability: interruptions and kills never lose work, a non-finite loss never overwrites good weights,
mismatched or damaged checkpoints and awkward inputs give one clear line or the right output, and training is
deterministic for a seed.

train.py runs in a subprocess, as a user runs it, where the behaviour needs another process (signals, kills, a
second writer) and for one error from the real command line; elsewhere the tools' main() runs in-process as their
scripts run it (run_in_process), and graphs are built in-process where only their numbers matter.
"""
import errno
import fcntl
import glob
import gzip
import json
import os
import pty
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from toolkit.training import distributed
import prepro
from toolkit.base import machine
import test as test_cli
import train
import translate
import utils
from toolkit.data.datadir import MANIFEST_NAME, load_manifest
from toolkit.base.errors import UserError
from in_process import run_in_process
from toolkit.training.logdir import (CheckpointGone, find_checkpoint, load_trained_hparams,
                                     logdir_lock, restore, whole_records_size)
from toolkit.base.writing import atomic_write
from toolkit.base.reading import read_lines
from toolkit.training.graph import build_graph
from utils import calc_bleu

tf1 = tf.compat.v1

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")
TINY_MODEL = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--threads", "1",
              "--test_batch_size", "256"]
TRAIN_PAIRS = 2000
#: Seed of the random moments at which the SIGKILL test kills training.
SIGKILL_SEED = 18
SAVED = re.compile(r"^(SIGINT|SIGTERM): saved (\S+) at step (\d+); run the same command to resume$", re.M)
RESUMED = re.compile(r"^resumed from (\S+) at step (\d+), epoch (\d+)$", re.M)
PROGRESS = re.compile(r"epoch (\d+):\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)")

# The test split of the data dir that every trained model here uses: each awkward case once. Source, target.
EDGE_TEST = [
    ("dreiundzwanzig", "twenty-three"),
    ("", ""),  # empty pair
    ("", "an empty source"),  # empty source, its reference still counts in BLEU
    (" ".join(["eins zwei drei"] * 150), " ".join(["one two three"] * 150)),  # 450 words
    ("北京 🙂 Ωμέγα zwölf", "Beijing smile omega twelve"),  # characters the BPE model never saw
    ("null\u2028eins\x85zwei", "zero\u2029one two"),  # Unicode line separators inside a line
    ("  drei\t\u00a0vier  ", "three four"),  # tabs, no-break space, surrounding blanks
    ("einundzwanzig", "twenty-one"),  # the last line, written without a newline
]


# ------------------------------------------------------------------------------------------------
# Helpers


def script(name, *args):
    """Command line running one of the repository's scripts with string arguments."""
    return [sys.executable, str(ROOT / name), *map(str, args)]


def run(name, *args):
    """Runs a script to its end. Returns (exit code, stdout, stderr)."""
    result = subprocess.run(script(name, *args), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout, result.stderr


def assert_one_error_line(code, stderr, *phrases):
    """A user error: exit code 2, no traceback, one `error:` line holding every phrase."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, stderr
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


class Training:
    """A train.py process whose stderr is a terminal, so that its progress bar tells the step it has reached.
    Used as a context manager, which kills the process if a test fails before it ends."""

    def __init__(self, *args):
        terminal, child_end = pty.openpty()
        fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
        self.process = subprocess.Popen(script("train.py", *args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                        stderr=child_end, text=True)
        os.close(child_end)
        self.stdout, self.terminal = [], []
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_terminal, args=(terminal,), daemon=True)]
        for reader in self._readers:
            reader.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read_stdout(self):
        for line in self.process.stdout:
            self.stdout.append(line)

    def _read_terminal(self, terminal):
        while True:
            try:
                data = os.read(terminal, 4096)
            except OSError:  # the process closed the terminal
                break
            if not data:
                break
            self.terminal.append(data.decode("utf-8", "replace"))
        os.close(terminal)

    def wait_for(self, condition, what, timeout=120):
        """Waits until condition() is true; fails if the process ends first or after timeout seconds."""
        deadline = time.time() + timeout
        while not condition():
            assert self.process.poll() is None, "train.py ended (exit code %s) before %s:\n%s%s" % (
                self.process.returncode, what, "".join(self.stdout), "".join(self.terminal)[-3000:])
            assert time.time() < deadline, "no %s after %d s" % (what, timeout)
            time.sleep(0.05)

    def global_step_shown(self, steps_per_epoch):
        """The global step that the progress bar shows last (0 before it appears)."""
        shown = PROGRESS.findall("".join(self.terminal)[-2000:])
        if not shown:
            return 0
        epoch, done, total = map(int, shown[-1])
        assert total == steps_per_epoch
        return (epoch - 1) * steps_per_epoch + done

    def wait_for_step(self, step, steps_per_epoch):
        self.wait_for(lambda: self.global_step_shown(steps_per_epoch) >= step, "step %d" % step)

    def wait_for_stdout(self, pattern):
        """Waits for a line of stdout that matches the regular expression pattern; returns the match."""
        def search():
            return re.search(pattern, "".join(self.stdout), re.M)

        self.wait_for(search, "line matching %r" % pattern)
        return search()

    def finish(self):
        """Waits for the process to end. Returns (exit code, stdout)."""
        code = self.process.wait(timeout=120)
        for reader in self._readers:
            reader.join(timeout=10)
        return code, "".join(self.stdout)


def write_files_corpus(folder, splits):
    """Writes {split: [(source, target), ...]} as the six files of prepro's --dataset files, the test split with
    Windows line endings and no final newline (unless its last line is empty). Returns the prepro arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    args = ["--dataset", "files"]
    for split, pairs in splits.items():
        for side in (1, 2):
            lines = [pair[side - 1] for pair in pairs]
            text = "".join(line + "\n" for line in lines)
            if split == "test":  # a last line that is empty needs its newline
                text = "\r\n".join(lines) + ("\r\n" if lines[-1] == "" else "")
            path = folder / ("%s.%d" % (split, side))
            path.write_bytes(text.encode("utf-8"))
            args += ["--%s%d" % (split, side), path]
    return args


def checkpoint_step(ckpt):
    return int(ckpt.rsplit("-", 1)[1])


def read_checkpoint(ckpt):
    """Every tensor of a checkpoint, read in full: {name: numpy value}."""
    reader = tf.train.load_checkpoint(str(ckpt))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_finite(values):
    for name, value in values.items():
        if np.issubdtype(value.dtype, np.floating):
            assert np.isfinite(value).all(), name


# ------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A numbers corpus (2000 train, 30 dev pairs) with the test split EDGE_TEST, built by prepro."""
    corpus = prepro.numbers_corpus(TRAIN_PAIRS, 30, 1, seed=1)
    folder = tmp_path_factory.mktemp("corpus")
    args = write_files_corpus(folder / "in", {"train": list(zip(*corpus["train"])),
                                              "eval": list(zip(*corpus["eval"])), "test": EDGE_TEST})
    assert prepro.main([*map(str, args), "--vocab_size", "300", "--data_dir", str(folder / "data")]) == 0
    return folder / "data"


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A logdir with a tiny model trained one epoch (15 steps): its only checkpoint is E01_...-15."""
    logdir = tmp_path_factory.mktemp("trained") / "run"
    assert train.main(["--data_dir", str(data_dir), "--logdir", str(logdir), *TINY_MODEL, "--batch_size", "2000",
                       "--max_steps", "15"]) == 0
    assert tf.train.latest_checkpoint(str(logdir)).endswith("-15")
    return logdir


def copy_logdir(logdir, target):
    shutil.copytree(logdir, target)
    return target


# ------------------------------------------------------------------------------------------------
# Interruptions


@pytest.mark.slow
def test_sigint_and_sigterm_save_the_current_step_and_resume_there(data_dir, tmp_path, capsys):
    steps_per_epoch = TRAIN_PAIRS // 16
    args = ["--data_dir", data_dir, "--logdir", tmp_path / "run", *TINY_MODEL, "--batch_type", "sentences",
            "--batch_size", "16", "--eval_every", "100", "--summary_every", "10", "--max_steps", "100000"]

    with Training(*args) as first:
        first.wait_for_step(3, steps_per_epoch)
        first.process.send_signal(signal.SIGINT)
        code, out = first.finish()
    assert code == 128 + signal.SIGINT, out
    name, ckpt, step = SAVED.search(out).groups()
    step = int(step)
    assert name == "SIGINT" and ckpt == str(tmp_path / "run" / ("interrupted-%d" % step)) and step >= 3
    values = read_checkpoint(ckpt)
    epoch, epoch_step = values["training_state"]
    assert values["global_step"] == step and epoch * steps_per_epoch + epoch_step == step
    # Adam's bias correction counts the same steps, so its state goes on where it was too.
    np.testing.assert_allclose(values["beta1_power"], 0.9 ** (step + 1), rtol=1e-4)
    with Training(*args) as second:
        assert second.wait_for_stdout(RESUMED.pattern).groups() == (ckpt, str(step), str(epoch + 1))
        second.wait_for_step(max(step + 3, 11), steps_per_epoch)
        second.process.send_signal(signal.SIGTERM)
        code, out = second.finish()
    assert code == 128 + signal.SIGTERM, out
    name, ckpt, step = SAVED.search(out).groups()
    step = int(step)
    epoch, epoch_step = read_checkpoint(ckpt)["training_state"]
    assert name == "SIGTERM" and epoch * steps_per_epoch + epoch_step == step
    # The summaries of step 10 (--summary_every 10) are on disk, wherever the runs were interrupted, and their
    # learning rate is the warm-up's at global step 9, from which step 10 trained: 1e-3 * 9 / --warmup_steps 1000.
    lr = {event.step: value.simple_value for path in (tmp_path / "run").glob("events.out.tfevents.*")
          for event in tf1.train.summary_iterator(str(path)) for value in event.summary.value if value.tag == "lr"}
    np.testing.assert_allclose(lr[10], 1e-3 * 9 / 1000, rtol=1e-5)

    code, out, err = run_in_process(capsys, "train.py", train.main, *args[:4], "--max_steps", step + 2)
    assert code == 0, err
    assert RESUMED.search(out).groups() == (ckpt, str(step), str(epoch + 1))
    assert "done: step %d" % (step + 2) in out


@pytest.mark.parametrize("signum, where", [(signal.SIGINT, "dev decode"), (signal.SIGTERM, "save")])
def test_a_stop_during_a_dev_decode_or_a_save_is_acknowledged_and_saves_one_checkpoint(trained, tmp_path, capfd,
                                                                                        monkeypatch, signum, where):
    """The signal arrives in the middle of the dev decode of epoch 2 (which is abandoned at once) or of the save after
    it (which is finished): one line says so, the weights of step 30 are saved once, and the exit code
    is the signal's."""
    logdir = copy_logdir(trained, tmp_path / "run")
    target, name = (train, "get_hypotheses") if where == "dev decode" else (tf1.train.Saver, "save")
    real = getattr(target, name)
    decoded = []

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        decoded.append(where)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, signalled)
    code, out, err = run_in_process(capfd, "train.py", train.main, "--logdir", logdir, "--max_steps", "40",
                                    "--lr_schedule", "noam", "--eval_every", "1")
    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    doing = ("abandoning the dev evaluation, saving the checkpoint of step 30" if where == "dev decode" else
             "finishing the checkpoint being saved")
    assert err.count("%s: %s, then stopping" % (name, doing)) == 1, err
    assert decoded == ([] if where == "dev decode" else [where]), "the decode went on after the signal"
    saved = sorted(path.name for path in logdir.glob("*-30.index"))
    assert len(saved) == 1 and not saved[0].startswith("interrupted"), saved
    assert re.search(r"^%s: saved %s at step 30; run the same command to resume$" % (
        name, re.escape(str(logdir / saved[0][:-len(".index")]))), out, re.M), out
    assert not (logdir / "dev" / "epoch02.txt").exists() if where == "dev decode" else "_B" in saved[0]


def checkpoint_files_being_written(logdir):
    """Names of the temporary files of TensorFlow's checkpoint writer in logdir (renamed into place when done)."""
    return {name for name in os.listdir(logdir) if ".tempstate" in name}


def kill_while_a_checkpoint_is_written(training, logdir, timeout=30):
    """Kills training as soon as a new checkpoint file is being written."""
    before, deadline = checkpoint_files_being_written(logdir), time.time() + timeout
    while not checkpoint_files_being_written(logdir) - before:
        assert training.process.poll() is None and time.time() < deadline, "no checkpoint written"
        time.sleep(0.001)
    training.process.kill()


@pytest.mark.slow
def test_sigkill_at_random_points_always_leaves_a_loadable_checkpoint(data_dir, tmp_path, capsys):
    """Epochs of two steps, so that a checkpoint is written several times a second. One kill lands while one is
    being written, one at a random moment."""
    logdir = tmp_path / "run"
    args = ["--data_dir", data_dir, "--logdir", logdir, *TINY_MODEL, "--batch_type", "sentences",
            "--batch_size", str(TRAIN_PAIRS // 2), "--eval_every", "100000", "--num_epochs", "100000",
            "--keep_checkpoints", "2"]
    rng = random.Random(SIGKILL_SEED)  # the same moments every run, so that a failure can be reproduced
    moments = ["while writing", rng.uniform(0, 1)]
    for moment in moments:
        with Training(*args) as training:
            training.wait_for_stdout(r"^epoch \d+ \| step")  # a checkpoint exists
            if moment == "while writing":
                kill_while_a_checkpoint_is_written(training, logdir)
            else:
                time.sleep(moment)
                training.process.kill()
            assert training.finish()[0] == -signal.SIGKILL
        state = tf1.train.get_checkpoint_state(str(logdir))
        assert state is not None, "no checkpoint index after a kill %s" % moment
        for ckpt in state.all_model_checkpoint_paths:
            assert_finite(read_checkpoint(ckpt))
        assert json.loads((logdir / "hparams.json").read_text())["d_model"] == 32
    latest = tf.train.latest_checkpoint(str(logdir))
    step = checkpoint_step(latest)

    code, out, err = run_in_process(capsys, "train.py", train.main, "--logdir", logdir, "--max_steps", step + 4)
    assert code == 0, err
    assert RESUMED.search(out).group(1, 2) == (latest, str(step)), "kills at %s" % moments
    assert "done: step %d" % (step + 4) in out


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic_write(str(path), "old\n")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(path), "new, but never complete\n")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["results.json"]


# ------------------------------------------------------------------------------------------------
# Non-finite loss


def test_a_non_finite_loss_stops_without_saving(trained, tmp_path, capsys):
    logdir = copy_logdir(trained, tmp_path / "run")
    before = sorted(os.listdir(logdir))
    good = tf.train.latest_checkpoint(str(logdir))
    # a rate at which the loss turns NaN after some steps but within the first epoch (at 1e9 it can stay finite,
    # if absurd, until the epoch's end saves)
    code, out, err = run_in_process(capsys, "train.py", train.main, "--logdir", logdir, "--lr", "1e10", "--max_steps",
                                    "100", "--lr_schedule", "noam")
    line = assert_one_error_line(code, err, "stopped without saving, the last good checkpoint is %s" % good,
                                 "Try a lower --lr, a longer --warmup_steps")
    step = int(re.search(r"loss is nan at step (\d+) \(epoch \d+\)", line).group(1))
    assert step > 15
    assert tf.train.latest_checkpoint(str(logdir)) == good
    assert [name for name in sorted(os.listdir(logdir)) if name not in before] == []
    assert_finite(read_checkpoint(good))


def tiny_graph(data_dir, logdir, **overrides):
    """toolkit.training.graph.build_graph for a tiny model on data_dir, in a new graph. Returns (graph, ops, hp)."""
    args = ["--data_dir", str(data_dir), "--logdir", str(logdir), *TINY_MODEL, "--batch_size", "2000"]
    for flag, value in overrides.items():
        args += ["--" + flag, str(value)]
    hp, manifest = train.resolve_hparams(args)
    graph = tf.Graph()
    with graph.as_default():
        cluster = distributed.make_cluster(hp, machine.session_config(hp))  # --distribute none: this process alone
        return graph, build_graph(hp, manifest, cluster), hp


def test_non_finite_weights_are_caught_before_a_save(data_dir, tmp_path):
    """A non-finite gradient in the last step of an epoch leaves a finite loss but NaN weights: train_epoch,
    after which train.py saves, must refuse them."""
    graph, g, hp = tiny_graph(data_dir, tmp_path)
    with graph.as_default(), tf1.Session(config=machine.session_config(hp)) as sess:
        sess.run(tf1.global_variables_initializer())
        weight = tf1.trainable_variables()[0]
        sess.run(tf1.assign(weight, tf.fill(tf.shape(weight), np.nan)))
        already_stopped = SimpleNamespace(signal="SIGINT")
        no_budget = SimpleNamespace(last_step=lambda: float("inf"), deadline=float("inf"))
        with pytest.raises(FloatingPointError, match="weights are not finite after step 0"):
            train.train_epoch(sess, g, 0, 0, None, 100, already_stopped, no_budget)


# ------------------------------------------------------------------------------------------------
# Wrong pairings and damaged checkpoints


def test_mismatched_or_damaged_checkpoints_give_one_clear_line(data_dir, trained, tmp_path, capsys):
    other_size, other_pieces = tmp_path / "vocab320", tmp_path / "other_pieces"
    assert prepro.main(["--n_train", "2000", "--n_eval", "5", "--n_test", "5", "--vocab_size", "320",
                        "--data_dir", str(other_size)]) == 0
    assert prepro.main(["--seed", "2", "--n_train", "2000", "--n_eval", "5", "--n_test", "5", "--vocab_size",
                        "300", "--data_dir", str(other_pieces)]) == 0
    good = tf.train.latest_checkpoint(str(trained))

    truncated = copy_logdir(trained, tmp_path / "truncated")
    data_file = truncated / (Path(good).name + ".data-00000-of-00001")
    os.truncate(data_file, data_file.stat().st_size // 2)
    other_shape = copy_logdir(trained, tmp_path / "other_shape")
    hparams = json.loads((other_shape / "hparams.json").read_text())
    (other_shape / "hparams.json").write_text(json.dumps({**hparams, "d_ff": 128}))
    lost = copy_logdir(trained, tmp_path / "lost")
    for path in lost.glob(Path(good).name + ".*"):
        path.unlink()

    results = [run_in_process(capsys, name, main, *args) for name, main, args in [
        ("test.py", test_cli.main, ["--logdir", trained, "--data_dir", other_size]),
        ("test.py", test_cli.main, ["--logdir", trained, "--data_dir", other_pieces]),
        ("test.py", test_cli.main, ["--logdir", trained, "--d_model", "64"]),
        ("test.py", test_cli.main, ["--logdir", trained, "--ckpt", trained / "E09-99"]),
        ("test.py", test_cli.main, ["--logdir", truncated]),
        ("train.py", train.main, ["--logdir", truncated, "--max_steps", "30"]),
        ("test.py", test_cli.main, ["--logdir", other_shape]),
        ("train.py", train.main, ["--logdir", lost, "--max_steps", "30"]),
    ]]
    vocab_size, vocab_pieces, d_model, missing, truncated_test, truncated_train, shape, lost_latest = results
    assert_one_error_line(*vocab_size[::2], "vocab size 320 of %s does not match vocab size 300" % other_size,
                          "pass the --data_dir it was trained on (%s)" % data_dir)
    assert_one_error_line(*vocab_pieces[::2], "BPE vocabulary (bpe.vocab) of %s is not the one the model in %s was "
                          "trained with, although the vocabulary has its size 300" % (other_pieces, trained),
                          "(%s)" % data_dir)
    assert_one_error_line(*d_model[::2], "unrecognized arguments: --d_model 64",
                          "the model's shape and training flags come from LOGDIR/hparams.json")
    assert_one_error_line(*missing[::2], "checkpoint %s not found; checkpoints in %s: %s"
                          % (trained / "E09-99", trained, good))
    for result in truncated_test, truncated_train:
        assert_one_error_line(*result[::2], "cannot restore %s (Read less bytes than requested); checkpoints in "
                              "%s: %s" % (truncated / Path(good).name, truncated, truncated / Path(good).name))
    assert_one_error_line(*shape[::2], "does not match the model that %s/hparams.json describes" % other_shape,
                          "is [32, 64] in the checkpoint but [32, 128] in the model")
    assert_one_error_line(*lost_latest[::2], "checkpoint %s not found" % (lost / Path(good).name))
    assert not [path for path in lost.glob("*.index") if not path.name.startswith("best-")], \
        "train.py started from scratch over a lost checkpoint"  # best-STEP: the best's own link, kept


# ------------------------------------------------------------------------------------------------
# Inputs at the edges


def test_every_test_line_gets_one_hypothesis_in_order(data_dir, trained, tmp_path, capsys):
    """EDGE_TEST: empty lines, a 450-word line, unseen characters, line separators, Windows line endings and no final
    newline. (Invalid UTF-8 is refused by prepro with file and line:
    tests/test_prepro.py test_invalid_utf8_names_file_and_line.)"""
    code, out, err = run_in_process(capsys, "test.py", test_cli.main, "--logdir", trained, "--testdir", tmp_path)
    assert code == 0, err
    hypotheses = (tmp_path / "hypotheses.txt").read_text(encoding="utf-8").split("\n")
    assert len(hypotheses) == len(EDGE_TEST) + 1 and hypotheses[-1] == ""
    hypotheses = hypotheses[:-1]
    assert hypotheses[1] == hypotheses[2] == ""  # empty sources; the order of batches: tests/test_data_load.py
    results = json.loads((tmp_path / "results.json").read_text())
    references = read_lines(data_dir / "test.2")
    assert results["sentences"] == len(references) == len(EDGE_TEST)
    assert references[2] == "an empty source" and references[5] == "zero one two"
    assert results["bleu"] == round(calc_bleu(references, hypotheses)[0], 2)


def test_prepro_filters_thousands_of_bad_training_pairs_and_never_dev_or_test(tmp_path):
    corpus = prepro.numbers_corpus(3000, 100, 100, seed=3)
    good = list(zip(*corpus["train"]))
    bad = (good[:2000]  # repeats
           + [("", "only a target"), ("only a source", ""), ("", "")] * 400  # empty sides
           + [("eins", "one " * 30)] * 1 + [(" ".join(["zwei"] * 25) + " %d" % i, "two") for i in range(49)])
    train_pairs = good + bad
    random.Random(0).shuffle(train_pairs)
    dev = list(zip(*corpus["eval"])) + [("", "")] * 5 + [good[0]] * 5 + [("eins", "one " * 30)]
    test = list(zip(*corpus["test"])) + [("", "nothing")] * 3
    args = [*map(str, write_files_corpus(tmp_path / "in", {"train": train_pairs, "eval": dev, "test": test})),
            "--vocab_size", "300"]

    assert prepro.main(args + ["--data_dir", str(tmp_path / "reported")]) == 0
    report = json.loads((tmp_path / "reported" / MANIFEST_NAME).read_text())["splits"]
    assert (report["train"]["empty_pairs"], report["train"]["duplicate_pairs"]) == (1200, 2000)
    assert report["train"]["ratio_outliers"] == 50 and report["train"]["lines"] == 3000 + 2000 + 50

    assert prepro.main(args + ["--dedup", "--filter_ratio", "--data_dir", str(tmp_path / "filtered")]) == 0
    report = json.loads((tmp_path / "filtered" / MANIFEST_NAME).read_text())["splits"]
    assert (report["train"]["dropped_empty"], report["train"]["dropped_duplicates"],
            report["train"]["dropped_ratio"]) == (1200, 2000, 50)
    kept = list(zip(read_lines(tmp_path / "filtered" / "train.1"), read_lines(tmp_path / "filtered" / "train.2")))
    assert sorted(kept) == sorted(good)
    for split, pairs in ("eval", dev), ("test", test):
        assert report[split]["lines"] == len(pairs)
        assert read_lines(tmp_path / "filtered" / ("%s.1" % split)) == [source for source, _ in pairs]
        assert report[split]["dropped_empty"] == report[split]["dropped_duplicates"] == 0


# ------------------------------------------------------------------------------------------------
# Determinism


def first_losses(data_dir, logdir, steps, **overrides):
    """The losses of the first steps of train.py's graph and session (dropout on, shuffled batches)."""
    graph, g, hp = tiny_graph(data_dir, logdir, threads=0, batch_size=1000, **overrides)
    with graph.as_default(), tf1.Session(config=machine.session_config(hp)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(g.train_init, {g.epoch: 0, g.skip: 0})
        return [sess.run([g.step.batch["update"], g.step.batch["loss"]])[1] for _ in range(steps)]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_first_10_losses(data_dir, tmp_path):
    """Exactly the same losses (CPU), while another seed gives other ones from its first steps on. (prepro's output
    is byte-identical for the same inputs: tests/test_prepro.py test_numbers_data_dir_is_byte_identical_for_a_seed.)"""
    first, again = first_losses(data_dir, tmp_path, steps=10), first_losses(data_dir, tmp_path, steps=10)
    assert len(first) == 10 and first == again
    assert first_losses(data_dir, tmp_path, steps=2, seed=99) != first[:2]


# ------------------------------------------------------------------------------------------------
# One train.py per logdir; readers of a logdir being trained


@pytest.mark.slow
def test_a_second_train_py_on_a_logdir_is_refused_while_readers_go_on(data_dir, tmp_path, capsys):
    """The first train.py holds LOGDIR/train.lock: a second one is refused with the first one's pid and writes
    nothing; test.py reads the logdir meanwhile, while every epoch (two steps) rotates the only kept checkpoint
    away; after the first is killed with SIGKILL, the lock is free again."""
    logdir = tmp_path / "run"
    args = ["--data_dir", data_dir, "--logdir", logdir, *TINY_MODEL, "--batch_type", "sentences",
            "--batch_size", str(TRAIN_PAIRS // 2), "--eval_every", "100000", "--num_epochs", "100000",
            "--keep_checkpoints", "1", "--lr_schedule", "noam"]
    with Training(*args) as first:
        first.wait_for_stdout(r"^epoch \d+ \| step")
        before = {path.name: path.stat().st_mtime for path in logdir.iterdir() if path.name == "hparams.json"}
        code, out, err = run_in_process(capsys, "train.py", train.main, *args[:4], "--d_model", "64",
                                        "--max_steps", "3")
        assert_one_error_line(code, err, "%s is being written by train.py process %d" % (logdir, first.process.pid),
                              "wait for it to end, stop it, or use another --logdir")
        assert {path.name: path.stat().st_mtime for path in logdir.iterdir() if path.name == "hparams.json"} == before
        code, out, err = run_in_process(capsys, "test.py", test_cli.main, "--logdir", logdir, "--testdir",
                                        tmp_path / "test")
        assert code == 0, err
        assert first.process.poll() is None, "the first train.py ended"
        first.process.kill()
        assert first.finish()[0] == -signal.SIGKILL
    with logdir_lock(str(logdir)):  # free again: the kernel released the killed process's lock
        pass
    assert not [name for name in os.listdir(logdir) if name.startswith(".reading-")]


def test_the_logdir_lock_refuses_a_second_writer_and_is_released_after(trained, tmp_path):
    import avg_checkpoints
    logdir = copy_logdir(trained, tmp_path / "run")
    with logdir_lock(str(logdir)):
        with pytest.raises(UserError, match="%s is being written by train.py process %d on "
                                                  % (re.escape(str(logdir)), os.getpid())):
            avg_checkpoints.main(["--logdir", str(logdir), "--last", "1"])
    assert avg_checkpoints.main(["--logdir", str(logdir), "--last", "1"]) == 0


def test_a_reader_restores_a_checkpoint_that_training_deletes_meanwhile(trained, tmp_path, monkeypatch):
    """restore() reads through hard links, so a checkpoint the Saver rotates away in the middle of a restore (here:
    its files are deleted before the variables are read) still restores whole."""
    logdir = copy_logdir(trained, tmp_path / "run")
    ckpt = tf.train.latest_checkpoint(str(logdir))
    expected = read_checkpoint(ckpt)["shared_weight_matrix/weight_mat"]
    real_restore = tf1.train.Saver.restore

    def rotated_away_first(saver, sess, path):
        for name in glob.glob(ckpt + ".*"):
            os.remove(name)
        return real_restore(saver, sess, path)

    monkeypatch.setattr(tf1.train.Saver, "restore", rotated_away_first)
    hp = load_trained_hparams(str(logdir), {})
    with tf.Graph().as_default():
        import decoding
        from data_load import Sources
        from model import ModelConfig
        from fast import build_transformer
        xs = Sources(tf1.placeholder(tf.int32, [None, None]), tf1.placeholder(tf.int32, [None]))
        decoding.translate(build_transformer(ModelConfig.from_flags(hp)), xs, decoding.DecodingSettings())
        with tf1.Session() as sess:
            assert restore(sess, ckpt, str(logdir)) == ckpt
            weights = sess.run(next(v for v in tf1.global_variables() if v.op.name.startswith("shared_weight")))
            np.testing.assert_array_equal(weights, expected)
            assert not glob.glob(ckpt + ".*") and not glob.glob(str(logdir / ".reading-*"))
            # The latest checkpoint, gone before it could be opened: the newest one instead, unless it was named.
            monkeypatch.setattr(tf1.train.Saver, "restore", real_restore)
            newest = str(tmp_path / "trained" / Path(ckpt).name)
            copy_logdir(trained, tmp_path / "trained")
            assert restore(sess, ckpt, str(tmp_path / "trained"), follow_latest=True) == newest
            with pytest.raises(CheckpointGone, match="was deleted while it was being opened"):
                restore(sess, ckpt, str(tmp_path / "trained"))


# ------------------------------------------------------------------------------------------------
# Flag ranges


BAD_TRAIN_FLAGS = [
    (["--dropout_rate", "1.5"], "--dropout_rate 1.5 is out of range: it must be at least 0 and below 1"),
    (["--dropout_rate", "-0.5"], "--dropout_rate -0.5 is out of range"),
    (["--dropout_rate", "1.0"], "--dropout_rate 1.0 is out of range"),
    (["--lr", "-1"], "--lr -1.0 is out of range: it must be above 0"),
    (["--lr", "nan"], "--lr nan is out of range"),
    (["--maxlen1", "0"], "--maxlen1 0 is out of range: it must be at least 2"),
    (["--batch_size", "0"], "--batch_size 0 is out of range: it must be at least 1"),
    (["--batch_size", "3"], "--batch_size 3 tokens cannot hold a pair of --maxlen1 100 / --maxlen2 100 pieces"),
    (["--num_heads", "0"], "--num_heads 0 is out of range: it must be at least 1"),
    (["--num_heads", "3"], "--num_heads 3 must divide --d_model 32"),
    (["--warmup_steps", "0"], "--warmup_steps 0 is out of range: it must be at least 1"),
    (["--summary_every", "0"], "--summary_every 0 is out of range: it must be at least 1"),
    (["--test_batch_size", "0"], "--test_batch_size 0 is out of range: it must be at least 1"),
    (["--beam_size", "0"], "--beam_size 0 is out of range: it must be at least 1"),
    (["--max_len_b", "0"], "--max_len_b 0 is out of range: it must be from 1 to 1000000"),
    (["--max_len_a", "1001"], "--max_len_a 1001.0 is out of range: it must be from 0 to 1000"),
]


@pytest.mark.parametrize("flags, message", BAD_TRAIN_FLAGS, ids=[" ".join(flags) for flags, _ in BAD_TRAIN_FLAGS])
def test_an_out_of_range_flag_is_refused_before_anything_is_built(data_dir, tmp_path, flags, message):
    args = ["--data_dir", str(data_dir), "--logdir", str(tmp_path / "run"), *TINY_MODEL, *flags]
    with pytest.raises(UserError, match=re.escape(message)):
        train.resolve_hparams(args)
    assert not (tmp_path / "run").exists()


def test_out_of_range_flags_are_one_line_in_every_tool(trained, capsys):
    """train.py runs as a user runs it, the other tools in this process as their scripts run them."""
    import export
    train_result = run("train.py", "--logdir", trained, "--dropout_rate", "1.5")
    assert_one_error_line(*train_result[::2], "--dropout_rate 1.5 is out of range")
    test_result = run_in_process(capsys, "test.py", test_cli.main, "--logdir", trained, "--beam_size", "0")
    assert_one_error_line(*test_result[::2], "--beam_size 0 is out of range: it must be at least 1")
    translate_result = run_in_process(capsys, "translate.py", translate.main, "--logdir", trained, "--nbest", "0",
                                      "eins")
    assert_one_error_line(*translate_result[::2], "--nbest 0 is out of range: it must be at least 1")
    export_result = run_in_process(capsys, "export.py", export.main, "--logdir", trained, "--export_dir",
                                   trained / "x", "--beam_size", "0")
    assert_one_error_line(*export_result[::2], "--beam_size 0 is out of range")


# ------------------------------------------------------------------------------------------------
# Empty splits


def test_prepro_refuses_an_empty_dev_or_test_split(tmp_path, capsys):
    corpus = prepro.numbers_corpus(300, 5, 5, seed=1)
    pairs = {split: list(zip(*corpus[split])) for split in ("train", "eval", "test")}
    for split, name in ("eval", "dev"), ("test", "test"):
        args = write_files_corpus(tmp_path / split, {**pairs, split: [("", "")]})
        (tmp_path / split / ("%s.1" % split)).write_bytes(b"")
        (tmp_path / split / ("%s.2" % split)).write_bytes(b"")
        assert prepro.main([*map(str, args), "--vocab_size", "100", "--data_dir", str(tmp_path / "data")]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "the %s split is empty (--%s1 %s" % (name, split, tmp_path / split) in error
        assert not (tmp_path / "data" / MANIFEST_NAME).exists()


def test_train_refuses_a_training_set_that_the_length_limits_empty(tmp_path):
    """Every training source has 4 words or more, so --maxlen1 3 (two pieces and </s>) leaves no pair."""
    corpus = prepro.numbers_corpus(600, 5, 5, seed=1)
    long_pairs = [pair for pair in zip(*corpus["train"]) if min(len(side.split()) for side in pair) >= 4]
    args = write_files_corpus(tmp_path / "in", {"train": long_pairs, "eval": list(zip(*corpus["eval"])),
                                                "test": list(zip(*corpus["test"]))})
    assert prepro.main([*map(str, args), "--vocab_size", "100", "--data_dir", str(tmp_path / "data")]) == 0
    with pytest.raises(UserError, match=r"no training pairs left: all %d pairs of .* are longer than "
                                              r"--maxlen1 3 / --maxlen2 100 pieces" % len(long_pairs)):
        train.main(["--data_dir", str(tmp_path / "data"), "--logdir", str(tmp_path / "run"), *TINY_MODEL,
                    "--maxlen1", "3", "--batch_size", "2000"])
    assert not (tmp_path / "run" / "hparams.json").exists()


def emptied_split(data_dir, target, split):
    """A copy of data_dir as the prepro of manifest format 1 (text files only) wrote it before it refused empty
    splits: split `split` has no lines."""
    shutil.copytree(data_dir, target)
    for name in ("%s.1" % split, "%s.2" % split, "%s.1.bpe" % split, "%s.2.bpe" % split):
        (target / name).write_bytes(b"")
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    manifest["splits"][split]["lines"] = 0
    (target / MANIFEST_NAME).write_text(json.dumps(dict(manifest, format=1)))
    return target


def test_empty_dev_and_test_splits_of_an_old_data_dir_are_one_line(data_dir, trained, tmp_path):
    assert calc_bleu([], [])[0] == 0.0
    no_dev = emptied_split(data_dir, tmp_path / "no_dev", "eval")
    with pytest.raises(UserError, match="the dev split of %s is empty" % re.escape(str(no_dev))):
        train.main(["--data_dir", str(no_dev), "--logdir", str(tmp_path / "run"), *TINY_MODEL])
    no_test = emptied_split(data_dir, tmp_path / "no_test", "test")
    with pytest.raises(UserError, match="the test split of %s is empty" % re.escape(str(no_test))):
        test_cli.main(["--logdir", str(trained), "--data_dir", str(no_test)])


# ------------------------------------------------------------------------------------------------
# prepro --force


def test_a_failed_force_rebuild_leaves_the_old_data_dir_usable(tmp_path, capsys):
    data = tmp_path / "data"
    small = ["--n_train", "300", "--n_eval", "5", "--n_test", "5", "--data_dir", str(data)]
    assert prepro.main([*small, "--vocab_size", "100"]) == 0
    before = {path.name: path.read_bytes() for path in data.iterdir()}
    assert prepro.main([*small, "--vocab_size", "100000", "--force"]) == 2  # more pieces than the corpus has
    assert "vocab" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in data.iterdir()} == before
    assert load_manifest(str(data))["vocab_size"] == 100
    assert prepro.main([*small, "--vocab_size", "120", "--force"]) == 0
    assert load_manifest(str(data))["vocab_size"] == 120 and set(os.listdir(data)) == set(before)


# ------------------------------------------------------------------------------------------------
# Bounded decoding


def nan_decoder(cache_len, vocab_size=8):
    """A step function that gives NaN logits and writes each step into a cache of fixed length cache_len, as the
    model's cached decoder does (a step past the cache is an InvalidArgumentError). Beam search also passes
    parents, the rows of the cache that its hypotheses continue."""
    def step_fn(tokens, step, cache, parents=None):
        if parents is not None:
            cache = tf.gather(cache, parents)
        rows = tf.range(tf.shape(cache)[0])
        at = tf.stack([rows, tf.fill(tf.shape(rows), step)], 1)
        cache = tf.tensor_scatter_nd_update(cache, at, tf.cast(tokens, tf.float32))
        return tf.fill([tf.shape(tokens)[0], vocab_size], np.nan), cache
    return step_fn


@pytest.mark.parametrize("beam_size", [1, 3])
def test_decoding_stops_at_its_length_limit_whatever_the_log_probabilities(beam_size):
    from decoding import beam_search, greedy_search
    max_steps = np.array([4, 7], np.int32)
    with tf.Graph().as_default(), tf1.Session() as sess:
        cache = tf.zeros([2 * beam_size, 7])
        if beam_size == 1:
            ids = greedy_search(nan_decoder(7), cache, tf.constant(max_steps), alpha=0.6)[0]
        else:
            ids = beam_search(nan_decoder(7), cache, tf.constant(max_steps), beam_size, alpha=0.6)[0]
            ids = ids[:, 0]
        ids = sess.run(ids)
    assert ids.shape[1] <= 7
    if beam_size == 1:  # every sentence ends with </s> at its limit
        assert [list(row).index(3) + 1 for row in ids] == list(max_steps)


@pytest.mark.slow
def test_non_finite_dev_scores_with_finite_weights_stop_without_saving(trained, tmp_path, monkeypatch):
    """Weights near float32's limit are finite, but the logits overflow: the dev decode ends (bounded) and its
    scores are not finite, which train.py treats like non-finite weights."""
    logdir = copy_logdir(trained, tmp_path / "run")
    good = tf.train.latest_checkpoint(str(logdir))
    before = sorted(os.listdir(logdir))
    real_evaluate = train.evaluate

    def evaluate_with_huge_weights(sess, g, *args):
        sess.run([variable.assign(variable * 1e36) for variable in tf1.trainable_variables()])
        assert sess.run(g.weights_finite)
        return real_evaluate(sess, g, *args)

    monkeypatch.setattr(train, "evaluate", evaluate_with_huge_weights)
    with pytest.raises(UserError, match="dev: decoding scores are not finite .*; stopped without saving, "
                                              "the last good checkpoint is %s" % re.escape(good)):
        train.main(["--logdir", str(logdir), "--max_steps", "17", "--lr_schedule", "noam"])
    assert tf.train.latest_checkpoint(str(logdir)) == good
    assert [name for name in sorted(os.listdir(logdir)) if name not in before
            and not name.startswith("events.out.tfevents")] == []


# ------------------------------------------------------------------------------------------------
# Broken JSON files


def test_broken_json_files_are_one_line_naming_the_file(data_dir, trained, tmp_path, capsys):
    broken_hparams = copy_logdir(trained, tmp_path / "hparams")
    text = (broken_hparams / "hparams.json").read_text()
    (broken_hparams / "hparams.json").write_text(text[:len(text) // 2])
    for main in (train.main, test_cli.main, lambda argv: translate.main(argv + ["eins"])):
        with pytest.raises(UserError, match="%s is not valid JSON" % re.escape(
                str(broken_hparams / "hparams.json"))):
            main(["--logdir", str(broken_hparams)])

    broken_data = tmp_path / "data"
    shutil.copytree(data_dir, broken_data)
    (broken_data / MANIFEST_NAME).write_text("not json\n")
    for main in (train.main, test_cli.main):
        with pytest.raises(UserError, match="%s is not valid JSON .*prepro.py --data_dir %s --force" % (
                re.escape(str(broken_data / MANIFEST_NAME)), re.escape(str(broken_data)))):
            main(["--logdir", str(trained), "--data_dir", str(broken_data)])



#: How a logdir's checkpoint index gets lost or damaged.
INDEX_DAMAGES = {"deleted": os.remove, "empty": lambda path: path.write_text(""),
                 "cut short": lambda path: path.write_text("model_checkpoint_path: \"E01"),
                 "garbage": lambda path: path.write_bytes(b"\xff\x00 {{")}


@pytest.mark.parametrize("damage", INDEX_DAMAGES)
def test_a_lost_checkpoint_index_is_rebuilt_from_the_checkpoints_on_disk(trained, tmp_path, capsys, damage):
    logdir = copy_logdir(trained, tmp_path / "run")
    good = tf.train.latest_checkpoint(str(trained))
    for path in logdir.glob(Path(good).name + ".*"):  # an older checkpoint, written later: newest by step wins
        shutil.copy(path, str(path).replace(Path(good).name, "zzz-3"))
    INDEX_DAMAGES[damage](logdir / "checkpoint")
    before = sorted(os.listdir(logdir))
    code, out, err = run_in_process(capsys, "train.py", train.main, "--logdir", logdir)
    assert code == 0 and "nothing to do: %s is at step 15" % logdir in out, err  # never a fresh start at step 0
    assert "note: %s is missing or damaged; the checkpoints on disk are used, the newest %s" % (
        logdir / "checkpoint", logdir / Path(good).name) in err
    assert sorted(os.listdir(logdir)) == before
    assert find_checkpoint(str(logdir)) == str(logdir / Path(good).name)


#: Hand edits of hparams.json that leave a key missing or unknown, and the phrase of the line about each.
KEY_EDITS = [(lambda saved: saved.pop("d_model"), "the key d_model is missing"),
             (lambda saved: saved.update(dmodel=saved.pop("d_model")), "dmodel is not a key train.py writes"),
             (lambda saved: saved.pop("data_dir"), "the key data_dir is missing")]


def test_missing_or_unknown_hparams_keys_are_refused_before_anything_is_written(trained, tmp_path, capsys):
    logdir = copy_logdir(trained, tmp_path / "run")
    saved = json.loads((logdir / "hparams.json").read_text())
    for edit, phrase in KEY_EDITS:
        edited = dict(saved)
        edit(edited)
        (logdir / "hparams.json").write_text(json.dumps(edited))
        before = {path.name: path.read_bytes() for path in logdir.iterdir() if path.is_file() and path.name != "train.lock"}
        for name, main in (("train.py", train.main), ("test.py", test_cli.main)):
            code, _, err = run_in_process(capsys, name, main, "--logdir", logdir)
            assert_one_error_line(code, err, "%s: %s" % (logdir / "hparams.json", phrase))
        assert {path.name: path.read_bytes() for path in logdir.iterdir() if path.is_file() and path.name != "train.lock"} == before
    (logdir / "hparams.json").unlink()
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", logdir, "--data_dir", saved["data_dir"])
    assert_one_error_line(code, err, "%s holds checkpoints (%s) but no hparams.json" % (
        logdir, Path(tf.train.latest_checkpoint(str(trained))).name))
    assert not (logdir / "hparams.json").exists()


# ------------------------------------------------------------------------------------------------
# A full disk


def enospc():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def assert_whole_events_files(logdir):
    for path in logdir.glob("events.out.tfevents.*"):
        assert whole_records_size(str(path)) == path.stat().st_size, path
        list(tf1.train.summary_iterator(str(path)))  # reads to the end without a DataLossError


@pytest.mark.slow
def test_a_full_disk_while_a_checkpoint_is_written_keeps_the_last_good_one(trained, tmp_path, monkeypatch):
    """ENOSPC injected into the Saver after it wrote part of the checkpoint's files."""
    logdir = copy_logdir(trained, tmp_path / "run")
    good = tf.train.latest_checkpoint(str(logdir))

    def save_on_a_full_disk(saver, sess, prefix, global_step, **kwargs):
        path = "%s-%d" % (prefix, sess.run(global_step))
        Path(path + ".data-00000-of-00001.tempstate123").write_bytes(b"half")
        os.makedirs(path + "_temp")
        raise tf.errors.ResourceExhaustedError(None, None, "%s_temp/part-00000-of-00001.data-00000-of-00001; No "
                                                           "space left on device" % path)

    monkeypatch.setattr(tf1.train.Saver, "save", save_on_a_full_disk)
    before = set(os.listdir(logdir))
    with pytest.raises(UserError) as error:
        train.main(["--logdir", str(logdir), "--max_steps", "30", "--lr_schedule", "noam"])
    message = str(error.value)
    assert re.match(r"no space left on the device while writing the checkpoint E02_L[\d.]+_B[\d.]+-30 \([\d.]+ MB "
                    r"free on %s\); removed what was half-written, the last good checkpoint %s is untouched"
                    % (re.escape(str(logdir)), re.escape(good)), message), message
    assert tf.train.latest_checkpoint(str(logdir)) == good
    new = set(os.listdir(logdir)) - before
    assert all(name.startswith("events.out.tfevents") or name == "test" for name in new), new
    assert_whole_events_files(logdir)
    assert_finite(read_checkpoint(good))


@pytest.mark.slow
def test_a_full_disk_while_dev_hypotheses_are_written_leaves_no_partial_file(trained, tmp_path, monkeypatch):
    """ENOSPC injected where the kernel reports it for a buffered write: at fsync of the dev hypothesis file."""
    logdir = copy_logdir(trained, tmp_path / "run")
    good = tf.train.latest_checkpoint(str(logdir))
    real_fsync = os.fsync

    def fsync(fd):
        if "%sdev%s" % (os.sep, os.sep) in os.readlink("/proc/self/fd/%d" % fd):
            raise enospc()
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(UserError, match=r"no space left on the device while writing %s \([\d.]+ MB free on "
                                              r"%s\); removed what was half-written, the last good checkpoint %s "
                                              r"is untouched" % (re.escape(str(logdir / "dev" / "epoch02.txt")),
                                                                 re.escape(str(logdir / "dev")), re.escape(good))):
        train.main(["--logdir", str(logdir), "--max_steps", "30", "--lr_schedule", "noam"])
    assert sorted(os.listdir(logdir / "dev")) == ["epoch01.txt"]
    assert tf.train.latest_checkpoint(str(logdir)) == good
    assert_whole_events_files(logdir)


def test_a_torn_events_record_is_cut_off(tmp_path):
    path = tmp_path / "events.out.tfevents.1"
    with tf1.python_io.TFRecordWriter(str(path)) as writer:
        writer.write(b"a whole record")
    whole = path.stat().st_size
    with open(path, "ab") as f:
        f.write(struct.pack("<Q", 100) + b"\0" * 20)  # a record whose write stopped early
    assert whole_records_size(str(path)) == whole


# ------------------------------------------------------------------------------------------------
# Messages


def test_prepro_reads_gzipped_files_and_names_a_directory(tmp_path, capsys):
    corpus = prepro.numbers_corpus(300, 5, 5, seed=1)
    args = write_files_corpus(tmp_path / "in", {split: list(zip(*corpus[split]))
                                                for split in ("train", "eval", "test")})
    gzipped = []
    for arg in map(str, args):
        if os.path.isfile(arg):
            with open(arg, "rb") as f, gzip.open(arg + ".gz", "wb") as out:
                out.write(f.read())
            arg += ".gz"
        gzipped.append(arg)
    assert prepro.main([*map(str, args), "--vocab_size", "100", "--data_dir", str(tmp_path / "plain")]) == 0
    assert prepro.main([*gzipped, "--vocab_size", "100", "--data_dir", str(tmp_path / "gz")]) == 0
    for name in ("train.1", "test.2.bpe", "bpe.vocab"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "gz" / name).read_bytes()
    capsys.readouterr()
    directory = [str(tmp_path / "in") if arg.endswith("train.1") else arg for arg in map(str, args)]
    assert prepro.main([*directory, "--data_dir", str(tmp_path / "dir")]) == 2
    assert capsys.readouterr().err == "error: %s is a directory, not a file (--train1)\n" % (tmp_path / "in")


def test_checkpoint_file_names_and_relative_data_dirs(trained, tmp_path, monkeypatch):
    ckpt = tf.train.latest_checkpoint(str(trained))
    for suffix in (".index", ".data-00000-of-00001", ""):
        assert find_checkpoint(str(trained), ckpt + suffix) == ckpt
    logdir = copy_logdir(trained, tmp_path / "run")
    hparams = json.loads((logdir / "hparams.json").read_text())
    (logdir / "hparams.json").write_text(json.dumps({**hparams, "data_dir": "data/numbers_rel"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="not found from %s: the data dir data/numbers_rel in %s/hparams.json "
                                              "is relative to the directory train.py ran in; run from there, or "
                                              "pass --data_dir" % (re.escape(str(tmp_path)), re.escape(str(logdir)))):
        test_cli.main(["--logdir", str(logdir)])


def test_test_py_and_translate_py_take_only_their_flags(trained, capsys):
    code, out, err = run_in_process(capsys, "test.py", test_cli.main, "--help")
    assert code == 0 and "--beam_size" in out and "--testdir" in out
    assert "--lr " not in out and "--d_model" not in out and "--dropout_rate" not in out
    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", trained, "--lr", "0.1", "eins")
    assert_one_error_line(code, err, "unrecognized arguments: --lr", "see translate.py --help")


@pytest.mark.slow
def test_a_resume_with_nothing_to_do_says_so_and_how_to_train_longer(trained, tmp_path, capsys, monkeypatch):
    """The resume that trains longer also shows train.py's progress lines when the output is not a terminal (one
    run for both, as each is a graph build and a few steps)."""
    logdir = copy_logdir(trained, tmp_path / "run")
    before = sorted(os.listdir(logdir))
    assert train.main(["--logdir", str(logdir)]) == 0
    out = capsys.readouterr().out
    assert ("nothing to do: %s is at step 15 (1 epochs done), where its --lr_schedule linear decayed to 0 at step 15 "
            "ends training; to train longer, start a new --logdir, or resume with --lr_schedule noam" % logdir) in out
    assert sorted(os.listdir(logdir)) == before
    monkeypatch.setattr(utils, "PROGRESS_SECONDS", 0)
    assert train.main(["--logdir", str(logdir), "--lr_schedule", "noam", "--max_steps", "17"]) == 0
    out = capsys.readouterr().out
    assert "done: step 17" in out
    assert re.search(r"^epoch 2: 1/15 batches \(7%\), \d+ s, loss [\d.]+, tok_s \d+$", out, re.M), out
    assert re.search(r"^epoch 2: 2/15 batches", out, re.M)


@pytest.mark.slow
def test_progress_lines_of_test_py_when_the_output_is_not_a_terminal(trained, tmp_path, capsys, monkeypatch):
    """(train.py's: test_a_resume_with_nothing_to_do_says_so_and_how_to_train_longer.)"""
    monkeypatch.setattr(utils, "PROGRESS_SECONDS", 0)
    assert test_cli.main(["--logdir", str(trained), "--testdir", str(tmp_path / "test")]) == 0
    assert re.search(r"^test: 1/1 batches \(100%\), \d+ s$", capsys.readouterr().out, re.M)


@pytest.mark.slow
def test_a_kill_between_accumulated_batches_resumes_to_the_weights_of_an_uninterrupted_run(data_dir, tmp_path,
                                                                                            capsys):
    """--accum_steps 3: a SIGKILL lands after the first batch of step 7 was added to the accumulators (epochs of 7
    batches make steps of 3, 3 and 1 batches, so the last checkpoint is step 6's); the resumed run redoes that step
    and ends at the weights of a run never stopped. Dropout off and the reference path in fp32 on one thread, so
    that both runs compute the same numbers."""
    flags = ["--data_dir", data_dir, *TINY_MODEL, "--impl", "reference", "--precision", "fp32", "--seed", "7",
             "--dropout_rate", "0", "--attention_dropout", "0", "--relu_dropout", "0", "--accum_steps", "3",
             "--batch_type", "sentences", "--batch_size", str(TRAIN_PAIRS // 6), "--eval_every", "100000",
             "--num_epochs", "100000", "--max_steps", "40"]
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", tmp_path / "whole", *flags)
    assert code == 0, err
    # train.py, killed by its own SIGKILL in the middle of step 7's accumulation
    # (at the end of an epoch the first batch of the next step is out of range: the loop starts the next epoch)
    killed = ("import os, runpy, signal, sys\n"
              "from toolkit.training import step\n"
              "run = step.TrainStep.run\n"
              "def run_and_kill(self, sess, write_summaries):\n"
              "    if sess.run(self.global_step) == 6:\n"
              "        sess.run(self.batch, {self.write_summaries: False})\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "    return run(self, sess, write_summaries)\n"
              "step.TrainStep.run = run_and_kill\n"
              "sys.argv = ['train.py'] + sys.argv[1:]\n"
              "runpy.run_path('train.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", killed, "--logdir", str(tmp_path / "killed"), *map(str, flags)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert checkpoint_step(tf.train.latest_checkpoint(str(tmp_path / "killed"))) == 6
    code, out, err = run_in_process(capsys, "train.py", train.main, "--logdir", tmp_path / "killed", *flags)
    assert code == 0 and RESUMED.search(out), err
    whole = read_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "whole")))
    resumed = read_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "killed")))
    assert whole["global_step"] == resumed["global_step"] == 40
    for name, value in whole.items():
        if "/k/bias" not in name:  # its gradient is rounding noise (tests/test_accumulation.py)
            np.testing.assert_allclose(resumed[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
