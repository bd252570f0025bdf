"""Running a tool's main() in the test's process as its script runs it, without a subprocess's start-up (a
Python and TensorFlow import per process)."""
import sys

import pytest

from toolkit.base.cli import run_cli


def run_in_process(capsys, name, main, *args):
    """Runs main(args) through errors.run_cli with sys.argv[0] the script's name, as `python name args` would.
    capsys: the test's fixture, which captures the output. Returns (exit code, stdout, stderr)."""
    argv = list(map(str, args))
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [name, *argv])
        with pytest.raises(SystemExit) as exit:
            run_cli(lambda: main(argv))
    out, err = capsys.readouterr()
    return exit.value.code, out, err
