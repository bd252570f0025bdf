"""Run by tests/test_faults.py inside a private mount namespace where LOGDIR and DATA_DIR are read-only bind mounts:

    python tests/read_only_tools.py LOGDIR DATA_DIR NEW_LOGDIR

runs train.py, test.py, avg_checkpoints.py and export.py in this process as their scripts run them and prints, as
the last line, a JSON object {case: the tool's one error line, or "ok" when it ended with exit code 0}."""
import contextlib
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import avg_checkpoints  # noqa: E402
import export  # noqa: E402
import test  # noqa: E402
import train  # noqa: E402
from toolkit.base.cli import run_cli  # noqa: E402


def outcome(main, *args):
    """The error line of main(args) run through errors.run_cli, or "ok" when it exits with 0."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            run_cli(lambda: main(list(args)))
        except SystemExit as end:
            code = end.code
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    return "ok" if code == 0 else (lines[0] if len(lines) == 1 and "Traceback" not in err.getvalue()
                                   else "exit code %s: %s" % (code, err.getvalue()[-2000:]))


def main():
    logdir, data_dir, new_logdir = sys.argv[1:4]
    tiny = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "2000",
            "--max_steps", "2", "--eval_every", "0"]
    print(json.dumps({
        "train.py": outcome(train.main, "--logdir", logdir, "--max_steps", "70"),
        "test.py": outcome(test.main, "--logdir", logdir),
        "avg_checkpoints.py": outcome(avg_checkpoints.main, "--logdir", logdir, "--last", "1"),
        "test.py --testdir elsewhere": outcome(test.main, "--logdir", logdir, "--testdir", new_logdir + "-test"),
        "export.py from a read-only logdir": outcome(export.main, "--logdir", logdir, "--export_dir",
                                                     new_logdir + "-export"),
        "train.py over a read-only data dir": outcome(train.main, "--data_dir", data_dir, "--logdir", new_logdir,
                                                      *tiny),
    }))


if __name__ == "__main__":
    main()
