"""The one kind of user error of every tool, and how a tool reports it: one line `error: WHAT` on
standard error and exit code 2, never a traceback. Imports nothing heavy, so that prepro.py starts
without TensorFlow.

    raise UserError("checkpoint %s not found; checkpoints in %s: %s" % (...))   # what, where, what
        to do
    if __name__ == "__main__":
        run_cli(main)
"""
import argparse
import contextlib
import errno
import os
import re
import shutil
import signal
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
    """The space left on the file system holding path (or its nearest existing parent), e.g. "12.0
    MB"."""
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that its `finally` blocks and atomic writes clean up
    as for Ctrl-C."""


def interrupted_exit_code(interrupt):
    """The exit code of a tool ended by a KeyboardInterrupt: 143 for SIGTERM (Terminated), 130 for
    Ctrl-C."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def _terminate(signum, frame):
    raise Terminated()


def interrupted_at_start(signum, frame):
    """The SIGINT and SIGTERM handler of a tool until run_cli runs its main (toolkit.runtime
    installs it): Ctrl-C or SIGTERM while the tool imports TensorFlow is run_cli's one line and exit
    code 130 or 143, not a KeyboardInterrupt's traceback through the imports or a silent end."""
    print("interrupted", file=sys.stderr)
    raise SystemExit(128 + signum)


def end_quietly_on_a_closed_pipe():
    """Standard output was closed by its reader (`tool | head -1`): end as cat does, without a word.
    Standard output is pointed at /dev/null so that Python's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(128 + signal.SIGPIPE)


#: Whether a tool's main runs under run_cli, which handles Ctrl-C and SIGTERM from then on (a tool
#: that imports toolkit.runtime late, from its main, must not take them back).
main_running = False


def run_cli(main):
    """Runs main() and exits with its code. Every error the user can fix becomes one line on stderr
    and exit code 2 (error_line): a UserError, and an OSError or TensorFlow file error on a path
    (missing, not a directory, a directory, read-only, no permission, a full disk). A closed
    standard output ends the tool quietly (exit code 141, as a process killed by SIGPIPE); Ctrl-C or
    SIGTERM that main() does not handle itself is one line and exit code 130 or 143."""
    global main_running
    main_running = True
    previous = signal.signal(signal.SIGTERM, _terminate)
    if previous is interrupted_at_start:  # the tool has started: restored as the default
        previous = signal.SIG_DFL
    if signal.getsignal(signal.SIGINT) is interrupted_at_start:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main()
        # None: started with it closed (1>&-), where print() writes nothing
        if sys.stdout is not None:
            sys.stdout.flush()  # here, not at exit: a closed pipe must end in the handler below
        sys.exit(code)
    except BrokenPipeError:
        end_quietly_on_a_closed_pipe()
    # error_line tells what the user can fix; the rest is re-raised
    except Exception as error:  # noqa: BLE001
        line = error_line(error)
        if line is None:
            raise
        report(line)
        sys.exit(USER_ERROR_EXIT_CODE)
    except KeyboardInterrupt as interrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(interrupted_exit_code(interrupt))
    finally:
        signal.signal(signal.SIGTERM, previous)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a user error's one line and exit code (the usage is in
    --help).

    unrecognized_hint: what to add to the message about an unrecognized flag, e.g. where the flag's
    value comes from instead."""

    def __init__(self, *args, unrecognized_hint="", **kwargs):
        super().__init__(*args, **kwargs)
        self.unrecognized_hint = unrecognized_hint

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, over the arguments as command_line_arguments cleans them."""
        return super().parse_known_args(command_line_arguments(sys.argv[1:] if args is None
                                                               else args, self.error),
                                        namespace)

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            message += " (see %s --help%s)" % (self.prog, self.unrecognized_hint)
        report(message)
        sys.exit(USER_ERROR_EXIT_CODE)


#: The byte-order mark some editors put at the start of UTF-8 text, as a character.
BOM = "\ufeff"


def command_line_arguments(args, error):
    """The arguments with byte-order marks removed (pasted from a file that starts with one; files
    have theirs stripped too, toolkit.textfiles.lines_of); error(message) on an argument that is not
    valid UTF-8 (Python keeps its bytes as lone surrogates, which no library below can read)."""
    cleaned = []
    for number, arg in enumerate(map(str, args), 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as bad:
            raw, column = arg.encode("utf-8",
                                     "surrogateescape"), len(arg[:bad.start].encode("utf-8"))
            error("argument %d (%s) is not valid UTF-8 (byte 0x%02x at byte column %d): pass it in "
                  "UTF-8"
                  % (number, raw.decode("utf-8", "backslashreplace"), raw[column], column + 1))
        cleaned.append(arg.replace(BOM, ""))
    return cleaned
