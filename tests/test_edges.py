"""Edges of the command line: a thread count beyond any machine, an empty --logdir and Ctrl-C
while a tool is still importing TensorFlow are each one line, as every other user error is."""
import os
import signal
import subprocess
import sys
import time

from test_faults import ROOT, fresh_train, model, one_line  # noqa: F401 (model: a fixture)


def test_a_thread_count_beyond_any_machine_is_one_line(model, capsys):  # noqa: F811
    logdir, _ = model
    line = one_line(capsys, "translate.py", "--logdir", logdir, "--threads", "3000000000", "eins")
    assert line == ("error: --threads 3000000000 is out of range: it must be from 0 (every core) "
                    "to 4096")


def test_an_empty_logdir_names_the_flag(model, capsys):  # noqa: F811
    _, data_dir = model
    assert one_line(capsys, *fresh_train(data_dir, "")) == "error: --logdir is empty: pass a directory"


def test_ctrl_c_while_tensorflow_imports_is_one_line(tmp_path):
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--help"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # TensorFlow's import takes seconds
    assert process.poll() is None, "the tool started before it was interrupted"
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert (process.returncode, out, err) == (130, "", "interrupted\n")
