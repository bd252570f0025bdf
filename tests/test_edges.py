"""Edges of the command line: a thread count or a decoding limit beyond any machine, a number too large for a
float, an empty path flag, and Ctrl-C or SIGTERM while a tool is still importing TensorFlow are each one line, as
every other user error is."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import serve
from in_process import run_in_process
from test_faults import ROOT, fresh_train, model, one_line  # noqa: F401 (model: a fixture)


def test_a_thread_count_beyond_any_machine_is_one_line(model, capsys):  # noqa: F811
    logdir, _ = model
    line = one_line(capsys, "translate.py", "--logdir", logdir, "--threads", "3000000000", "eins")
    assert line == ("error: --threads 3000000000 is out of range: it must be from 0 (every core) "
                    "to 4096")


def test_an_empty_logdir_names_the_flag(model, capsys):  # noqa: F811
    _, data_dir = model
    assert one_line(capsys, *fresh_train(data_dir, "")) == "error: --logdir is empty: pass a directory"


@pytest.mark.parametrize("tool, flags", [
    ("translate.py", ["--input", ""]), ("translate.py", ["--output", "", "eins"]),
    ("translate.py", ["--plot_attention", "", "eins"]), ("test.py", ["--testdir", ""]),
    ("prepro.py", ["--dataset", "numbers", "--data_dir", ""])])
def test_a_path_flag_given_empty_names_the_flag(model, capsys, tool, flags):  # noqa: F811
    logdir, _ = model
    flag = flags[flags.index("") - 1]
    line = one_line(capsys, tool, *([] if tool == "prepro.py" else ["--logdir", logdir]), *flags)
    assert line == "error: %s is empty: pass a path, or leave the flag out" % flag


def test_a_decoding_limit_past_any_translation_is_one_line(model, capsys):  # noqa: F811
    logdir, _ = model
    assert one_line(capsys, "translate.py", "--logdir", logdir, "--max_len_a", "1e308", "eins") == (
        "error: --max_len_a 1e+308 is out of range: it must be from 0 to 1000")


#: A number of 401 digits, too large for a float, and how a line shows it.
HUGE, HUGE_SHOWN = 10 ** 400, "100000000000... (401 digits)"
#: What a count must be, whatever its lowest value: at most TensorFlow's int32.
AT_MOST = "and at most 2147483647"


def test_a_number_too_large_for_a_float_is_one_line_in_every_tool(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    new = tmp_path / "new"
    for tool, *args in (fresh_train(data_dir, new, "--warmup_steps", HUGE),
                        ("test.py", "--logdir", logdir, "--beam_size", HUGE),
                        ("translate.py", "--logdir", logdir, "--test_batch_size", HUGE, "eins"),
                        ("export.py", "--logdir", logdir, "--export_dir", tmp_path / "x", "--beam_size",
                         HUGE)):
        flag = args[-2] if tool != "translate.py" else args[-3]
        assert one_line(capsys, tool, *args) == (
            "error: %s %s is out of range: it must be at least 1 %s" % (flag, HUGE_SHOWN, AT_MOST)), tool
    # beyond numpy's and TensorFlow's integers, though a float holds it
    assert one_line(capsys, "translate.py", "--logdir", logdir, "--beam_size", 10 ** 20, "eins") == (
        "error: --beam_size 100000000000000000000 is out of range: it must be at least 1 %s" % AT_MOST)
    config = tmp_path / "config.json"
    for key, must_be in (("batch_size", "at least 1 " + AT_MOST), ("lr", "above 0"),
                         ("dropout_rate", "at least 0 and below 1")):
        config.write_text(json.dumps({key: HUGE}))
        assert one_line(capsys, *fresh_train(data_dir, new, "--config", config)) == (
            "error: %s: %s is %s, out of range: it must be %s" % (config, key, HUGE_SHOWN, must_be))
    hparams = logdir / "hparams.json"
    hparams.write_text(json.dumps({**json.loads(hparams.read_text()), "max_len_b": -HUGE}))
    assert one_line(capsys, "translate.py", "--logdir", logdir, "eins") == (
        "error: %s: max_len_b is -10000000000... (401 digits), out of range: it must be from 1 to 1000000"
        % hparams)
    assert not new.exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag", ["--port", "--beam_size"])
def test_a_number_too_large_for_a_float_is_one_line_in_serve_py(tiny_model, capsys, flag):
    code, _, err = run_in_process(capsys, "serve.py", serve.main, "--logdir", tiny_model[0], flag, HUGE)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: %s %s is out of range: it must be " % (flag, HUGE_SHOWN)), err


def as_from_a_terminal():
    """The signal dispositions of a tool started from an interactive shell, whatever this process
    inherited (a background job of a non-interactive shell, `nohup ... &`, starts with SIGINT
    ignored, and so would every process it starts)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("onednn", ["0", "1"])
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_while_tensorflow_imports_is_one_line(tmp_path, signum, code, onednn):
    """With oneDNN on, TensorFlow's start-up records come before the line: it is never taken for
    one's continuation."""
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--help"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn},
                               preexec_fn=as_from_a_terminal)
    time.sleep(1.5)  # TensorFlow's import takes seconds
    assert process.poll() is None, "the tool started before it was interrupted"
    os.kill(process.pid, signum)
    out, err = process.communicate(timeout=120)
    assert (process.returncode, out, err) == (code, "", "interrupted\n")


def test_the_runtime_imported_from_a_running_main_leaves_its_signal_handlers():
    """plot_attention.py imports TensorFlow (and toolkit.base.runtime) from its main: Ctrl-C from then on
    is run_cli's KeyboardInterrupt, never the start-up handler's exit from inside whatever runs."""
    code = ("import signal, sys\n"
            "sys.modules['__main__'].__file__ = %r  # as a tool of the toolkit runs\n"
            "from toolkit.base import cli\n"
            "def main():\n"
            "    from toolkit.base import runtime  # noqa: F401\n"
            "    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
            "          signal.getsignal(signal.SIGTERM) is cli._terminate)\n"
            "    return 0\n"
            "cli.run_cli(main)\n" % str(ROOT / "plot_attention.py"))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=as_from_a_terminal)
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr


def test_an_empty_checkpoint_name_names_the_flag(model, capsys):  # noqa: F811
    logdir, _ = model
    assert one_line(capsys, "avg_checkpoints.py", "--logdir", logdir, "--last", "1", "--output", "") == (
        "error: --output is empty: pass a name, or leave the flag out")


def test_a_vocabulary_beyond_sentencepiece_s_limit_is_one_line(tmp_path, capsys):
    """sentencepiece parses the size as a 32-bit integer: a larger one ended in a traceback after the corpus was
    read, leaving an empty data dir."""
    for value, shown in (("2147483648", "2147483648"), ("1" * 401, "111111111111... (401 digits)")):
        assert one_line(capsys, "prepro.py", "--dataset", "numbers", "--data_dir", tmp_path / "d", "--vocab_size",
                        value) == ("error: --vocab_size %s is out of range: it must be at most 2147483647 "
                                   "(sentencepiece's limit)" % shown)
        assert not (tmp_path / "d").exists()
