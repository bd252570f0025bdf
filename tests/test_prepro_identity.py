"""The data dirs of fixed prepro commands, as sha256 sums of every file: a change to prepro that must not change
its output is checked against the sums recorded in tests/fixtures/prepro_sha256.json.

    python tests/test_prepro_identity.py --record    # write the sums of the current prepro.py

The inputs are given as paths relative to the working directory, so the manifests (which name them) do not
depend on where the build runs.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import prepro  # noqa: E402
from test_prepro import SMALL_NUMBERS, files_args, toy_corpus  # noqa: E402

SUMS_PATH = Path(__file__).resolve().parent / "fixtures" / "prepro_sha256.json"

#: name of the build -> its prepro arguments (the files corpus is toy_corpus in ./in).
BUILDS = {
    "numbers": ["--data_dir", "numbers", *SMALL_NUMBERS],
    "files": ["--data_dir", "files", "--vocab_size", "80"],
    "files_filtered": ["--data_dir", "files_filtered", "--vocab_size", "80", "--dedup", "--filter_ratio"],
}


def build_all(workdir):
    """Run every build of BUILDS inside ``workdir``; returns {build: {file name: sha256}}."""
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        paths = {flag: path.relative_to(Path.cwd()) for flag, path in
                 toy_corpus(Path.cwd() / "in", eval_newline="\r\n").items()}
        sums = {}
        for name, argv in BUILDS.items():
            argv = argv + (files_args(paths) if name.startswith("files") else [])
            if prepro.main([str(arg) for arg in argv]) != 0:
                raise RuntimeError(f"prepro failed for {name}")
            sums[name] = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                          for path in sorted(Path(name).iterdir()) if path.is_file()}
        return sums
    finally:
        os.chdir(previous)


def test_the_same_commands_give_byte_identical_data_dirs(tmp_path):
    assert build_all(tmp_path) == json.loads(SUMS_PATH.read_text(encoding="utf-8"))


if __name__ == "__main__":
    import tempfile
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as workdir:
        SUMS_PATH.write_text(json.dumps(build_all(workdir), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SUMS_PATH}")
