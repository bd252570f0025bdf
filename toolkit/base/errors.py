"""The one kind of user error of every tool, and how a tool reports it: one line `error: WHAT` on
standard error and exit code 2, never a traceback. Imports nothing heavy, so that prepro.py starts
without TensorFlow.

    raise UserError("checkpoint %s not found; checkpoints in %s: %s" % (...))   # what, where, what
        to do
    if __name__ == "__main__":
        run_cli(main)
"""
import contextlib
import errno
import os
import re
import shutil
import sys

#: The exit code of a user error (argparse's own, so that a bad flag and a bad file look alike).
USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A problem the user can fix (bad flag, missing file, mismatched logdir): reported as one line,
    no traceback."""


class DiskFull(UserError):
    """No space left on the device (ENOSPC) while writing `what`; the partial file is gone."""

    def __init__(self, what, path):
        self.what, self.path = what, path
        super().__init__("no space left on the device while writing %s (%s free on %s)"
                         % (what, free_space(path), os.path.dirname(os.path.abspath(path))))


@contextlib.contextmanager
def writing(path, what=None, temporary=None):
    """Errors of the block, which writes ``what`` (default: path) at ``path``, turned into lines by
    what it was doing and where: a full disk (an OSError, or a TensorFlow error that says so) is a
    DiskFull naming what and the free space of path's own disk; an OSError that names no path, or
    the temporary file it writes through, is one naming path."""
    try:
        yield
    except OSError as error:
        if is_disk_full(error):
            raise DiskFull(str(what or path), str(path)) from None
        if error.errno and error.filename in (None, str(temporary)):
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise
    # only TensorFlow's full disk is turned into a line; the rest goes on
    except Exception as error:  # noqa: BLE001
        if is_tensorflow_error(error) and is_disk_full(error):
            raise DiskFull(str(what or path), str(path)) from None
        raise


#: errno values that mean the disk (or the user's quota) is full.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(error):
    """Whether an OSError, or a TensorFlow error from a file write (which carries the C library's
    message, not an errno), says that the disk or quota is full."""
    if isinstance(error, OSError):
        return error.errno in DISK_FULL_ERRNOS
    return "No space left on device" in str(error) or "Disk quota exceeded" in str(error)


def free_space(path):
    """The space left on the file system holding path (or its nearest existing parent),
    e.g. "12.0 MB"."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return "%.1f MB" % (shutil.disk_usage(path).free / 1e6)


def report(message):
    """Prints the one line of a user error on standard error."""
    print("error: %s" % message, file=sys.stderr)


#: What an OSError's errno means for the path it names, and what to do about it.
PATH_PROBLEMS = {
    errno.ENOENT: "does not exist (or a directory above it does not): check the path",
    errno.ENOTDIR: "has a file where a directory belongs in it: check the path",
    errno.EISDIR: "is a directory where a file belongs: name a file",
    errno.EROFS: "is on a read-only file system: pass a path on a writable one (or remount it "
                 "read-write)",
    errno.EACCES: "is not accessible (permission denied): change its permissions or pass another "
                  "path",
    errno.EPERM: "is not accessible (operation not permitted): change its permissions or pass "
                 "another path",
    errno.ENAMETOOLONG: "is too long a name: pass a shorter path",
    errno.EEXIST: "already exists: remove it or pass another path",
    errno.ENOTEMPTY: "is a directory that is not empty: remove it or pass another path",
    errno.ELOOP: "has too many levels of symbolic links: check the path",
}


def os_error_line(error):
    """The one line of an OSError that names a path (or has an errno): what went wrong with which
    path and what to do; None for one that carries neither (a bug, not the user's machine: it keeps
    its traceback)."""
    # the free space of the path's own disk; without a path, no figure of another disk's
    if is_disk_full(error):
        return ("no space left on the device while writing %s (%s free on %s)" % (
            error.filename, free_space(error.filename),
            os.path.dirname(os.path.abspath(error.filename))) if error.filename else "no space "
                "left on the device: free some space and run the same command again")
    if error.errno is None:
        return None
    where = " and ".join(str(name) for name in (error.filename, error.filename2)
                         if name is not None)
    problem = PATH_PROBLEMS.get(error.errno, "gives an error: %s"
                                % (error.strerror or os.strerror(error.errno)))
    return "%s %s" % (where, problem) if where else "%s (%s)" % (error.strerror,
                                                                 errno.errorcode.get(error.errno))


def error_line(error):
    """The one line of an error the user can fix: a UserError's message, the line of an OSError on a
    path (os_error_line), of a TensorFlow file error (file_op_error_line) or of a lost worker
    (lost_worker_line); None for any other error (a bug: it keeps its traceback)."""
    if isinstance(error, UserError):
        return str(error)
    if isinstance(error, OSError):
        return os_error_line(error)
    return file_op_error_line(error) or lost_worker_line(error)


def is_tensorflow_error(error, name=None):
    """Whether error is TensorFlow's (of the class `name`, if given). Told by its module, so that
    TensorFlow is not imported here."""
    return type(error).__module__.startswith("tensorflow") and name in (None, type(error).__name__)


def file_op_error_line(error):
    """TensorFlow's file operations (checkpoints, summaries) fail with an OpError that carries no
    errno but the C library's message after the path: when a line of it holds the message of an
    errno of PATH_PROBLEMS (or a full disk), that line and what to do; else None."""
    if not is_tensorflow_error(error):
        return None
    lines = [line.strip()[:300] for line
             in str(getattr(error, "message", "") or error).splitlines()]
    if is_disk_full(error):
        return "no space left on the device: %s" % next(line for line in lines
                                                        if is_disk_full(line))
    for number, problem in PATH_PROBLEMS.items():
        line = next((line for line in lines if os.strerror(number) in line), None)
        if line:
            return "%s: the path %s" % (line, problem)
    return None


def lost_worker_line(error):
    """The line of a distributed run whose collective failed because another worker is gone
    (UnavailableError: it was killed, or its host went down); None for any other error."""
    if not is_tensorflow_error(error, "UnavailableError"):
        return None
    lines = [line.strip() for line in str(getattr(error, "message", "") or error).splitlines()
             if line.strip()]
    cause = next((line for line in lines if LOST_CONNECTION.search(line)), lines[0] if lines
                 else "")
    return ("another worker of the cluster is gone (%s): the chief's last checkpoint is intact; "
            "restart every worker with the same command to resume from it" % cause[:200])


#: What the line of a collective's error that says why it failed speaks of (gRPC's words).
LOST_CONNECTION = re.compile(r"(?i)socket closed|connection|unavailable|aborted by|failed to "
                             r"connect|unreachable")
