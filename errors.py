"""The one kind of user error of every tool, and how a tool reports it: one line `error: WHAT` on standard error
and exit code 2, never a traceback. Imports nothing heavy, so that prepro.py starts without TensorFlow.

    raise UserError("checkpoint %s not found; checkpoints in %s: %s" % (...))   # what, where, what to do
    if __name__ == "__main__":
        run_cli(main)
"""
import argparse
import errno
import os
import shutil
import sys

#: The exit code of a user error (argparse's own, so that a bad flag and a bad file look alike).
USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A problem the user can fix (bad flag, missing file, mismatched logdir): reported as one line, no traceback."""


class DiskFull(UserError):
    """No space left on the device (ENOSPC) while writing `what`; the partial file is gone."""

    def __init__(self, what, path):
        self.what, self.path = what, path
        super().__init__("no space left on the device while writing %s (%s free on %s)"
                         % (what, free_space(path), os.path.dirname(os.path.abspath(path))))


#: errno values that mean the disk (or the user's quota) is full.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(error):
    """Whether an OSError, or a TensorFlow error from a file write (which carries the C library's message, not an
    errno), says that the disk or quota is full."""
    if isinstance(error, OSError):
        return error.errno in DISK_FULL_ERRNOS
    return "No space left on device" in str(error) or "Disk quota exceeded" in str(error)


def free_space(path):
    """The space left on the file system holding path (or its nearest existing parent), e.g. "12.0 MB"."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return "%.1f MB" % (shutil.disk_usage(path).free / 1e6)


def report(message):
    """Prints the one line of a user error on standard error."""
    print("error: %s" % message, file=sys.stderr)


def run_cli(main):
    """Runs main() and exits with its code; a UserError or a full disk becomes one line on stderr and exit code 2,
    a Ctrl-C that main() does not handle itself one line and exit code 130."""
    try:
        sys.exit(main())
    except UserError as error:
        report(error)
        sys.exit(USER_ERROR_EXIT_CODE)
    except OSError as error:  # a full disk where no caller names what was written (e.g. translate.py --output)
        if not is_disk_full(error):
            raise
        report("no space left on the device%s (%s free)" % (
            " while writing %s" % error.filename if error.filename else "", free_space(error.filename or ".")))
        sys.exit(USER_ERROR_EXIT_CODE)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a user error's one line and exit code (the usage is in --help).

    unrecognized_hint: what to add to the message about an unrecognized flag, e.g. where the flag's value comes
    from instead."""

    def __init__(self, *args, unrecognized_hint="", **kwargs):
        super().__init__(*args, **kwargs)
        self.unrecognized_hint = unrecognized_hint

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            message += " (see %s --help%s)" % (self.prog, self.unrecognized_hint)
        report(message)
        sys.exit(USER_ERROR_EXIT_CODE)
