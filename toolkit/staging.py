"""Where an output is built before it is renamed into place (staging dirs), and the removal of what
a process killed before its cleanup left behind (staging dirs, temporary files, checkpoint readers'
pins)."""
import contextlib
import glob
import os
import re
import shutil
import tempfile
from pathlib import Path

from toolkit.locks import process_alive


def remove_stale(directory, prefix, suffix=""):
    """Removes what a process killed before its cleanup left in ``directory``: the files and
    directories named PREFIX<PID>...SUFFIX (staging_dir's, atomic_file's, a checkpoint reader's
    pins) whose process PID is gone."""
    for path in glob.glob(os.path.join(glob.escape(str(directory)), glob.escape(prefix) + "*"
                                       + suffix)):
        pid = re.match(r"\d+", os.path.basename(path)[len(prefix):])
        if pid and not process_alive(int(pid.group())):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


@contextlib.contextmanager
def staging_dir(parent, prefix):
    """A new empty directory PARENT/PREFIX<PID>-XXXX to build an output in before it is renamed into
    place (a data dir's build, an export), removed with whatever is left in it when the block ends;
    those of killed runs (remove_stale) are removed first."""
    remove_stale(parent, prefix)
    path = Path(tempfile.mkdtemp(dir=parent, prefix="%s%d-" % (prefix, os.getpid())))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
