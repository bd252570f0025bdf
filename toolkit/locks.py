"""Which process holds what: exclusive locks on a file or directory (one writer at a time), the
description of a lock's holder, and whether a process is alive."""
import contextlib
import fcntl
import os
import socket
import time

from toolkit.errors import UserError, writing


def process_alive(pid):
    """Whether a process of this machine has the id pid (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def exclusive_lock(path, holder, busy):
    """Holds an exclusive lock (fcntl.flock) on ``path`` while the block runs, so that two processes
    never write one directory: path is a lock file (created if missing) into which ``holder``, a
    description of this process, is written for others to read, or a directory itself (nothing is
    written). When another process holds it, raises UserError(busy(its description or "another
    process")) at once. The kernel releases the lock when the process ends however it ends (SIGKILL
    too), so nothing left behind ever blocks a later run."""
    directory = os.path.isdir(path)
    with writing(path):
        fd = os.open(path, os.O_RDONLY if directory else os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = "" if directory else os.pread(fd, 1000, 0).decode("utf-8", "replace").strip()
            raise UserError(busy(other or "another process")) from None
        if not directory:
            with writing(path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder.encode("utf-8") + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def process_description(tool):
    """"TOOL process PID on HOST since TIME", for a lock's holder."""
    return "%s process %d on %s since %s" % (tool, os.getpid(), socket.gethostname(),
                                             time.strftime("%Y-%m-%d %H:%M:%S"))
