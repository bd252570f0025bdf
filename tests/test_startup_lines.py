"""TensorFlow's start-up lines stay out of the tools' standard error, whatever oneDNN setting TensorFlow starts
with (it turns oneDNN on by default on CPUs with AVX512-VNNI and later, and then says so): an error is one line."""
import os
import subprocess
import sys

import pytest

from toolkit.base.runtime import ABSL_NOTICE, startup_lines_kept

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: What TensorFlow 2.21 writes to standard error as it loads with oneDNN on (TF_ENABLE_ONEDNN_OPTS=1).
ONEDNN_NOTICE = ("I0000 00:00:1795847405.359305    3993 port.cc:153] oneDNN custom operations are on. You may see "
                 "slightly different numerical results due to floating-point round-off errors from different "
                 "computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n")
FEATURE_GUARD = ("I0000 00:00:1795847760.431706    8544 cpu_feature_guard.cc:227] This TensorFlow binary is "
                 "optimized to use available CPU instructions in performance-critical operations.\n"
                 "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
                 "appropriate compiler flags.\n")
A_WARNING = "W0000 00:00:1795847760.431706    8544 some.cc:12] a warning\n"
PYTHON_LINE = "/x/y.py:3: UserWarning: something a user should see\n"


def test_start_up_records_are_left_out_as_the_log_level_says():
    lines = [ABSL_NOTICE + "\n", ONEDNN_NOTICE, PYTHON_LINE] + FEATURE_GUARD.splitlines(True) + [A_WARNING]
    assert startup_lines_kept(lines, 2) == [PYTHON_LINE]  # the tools' default
    assert startup_lines_kept(lines, 1) == [PYTHON_LINE, A_WARNING]
    assert startup_lines_kept(lines, 0) == lines
    assert startup_lines_kept([PYTHON_LINE, "more of it\n"], 3) == [PYTHON_LINE, "more of it\n"]


def tool_commands(tmp_path):
    """Each tool with an input it refuses once TensorFlow is imported, and the one line it says."""
    missing_logdir = str(tmp_path / "no_run")
    logdir_line = "error: %s/hparams.json not found: is %s a logdir written by train.py?" % (missing_logdir,
                                                                                             missing_logdir)
    return {
        "translate.py": (["--logdir", missing_logdir, "eins"], logdir_line),
        "test.py": (["--logdir", missing_logdir], logdir_line),
        "export.py": (["--logdir", missing_logdir, "--export_dir", str(tmp_path / "export")], logdir_line),
        "serve.py": (["--logdir", missing_logdir], logdir_line),
        "avg_checkpoints.py": (["--logdir", missing_logdir, "--last", "2"], None),
        "plot_attention.py": (["--logdir", missing_logdir, "--dir", str(tmp_path / "plots"), "eins"], None),
        "train.py": (["--data_dir", str(tmp_path / "no_data"), "--logdir", str(tmp_path / "run")],
                     "error: %s/manifest.json not found: run `python prepro.py --data_dir %s` first" % (
                         tmp_path / "no_data", tmp_path / "no_data")),
    }


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"])
def test_every_tools_error_is_one_line_with_onednn_off_and_on(onednn, tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    commands = tool_commands(tmp_path)
    processes = {tool: subprocess.Popen([sys.executable, tool] + args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for tool, (args, _) in commands.items()}  # side by side: each one imports TensorFlow
    for tool, process in processes.items():
        _, err = process.communicate(timeout=300)
        expected = commands[tool][1]
        assert process.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), (tool, err)
        assert expected is None or err == expected + "\n", (tool, err)
