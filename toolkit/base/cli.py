"""How a tool runs: its main under run_cli (a user error is one line and exit code 2, Ctrl-C or
SIGTERM one line and 130 or 143, a closed pipe a quiet end), the handlers of signals that arrive
while it starts, and the parser whose errors are one line.

    if __name__ == "__main__":
        run_cli(main)
"""
import argparse
import os
import signal
import sys
from toolkit.base.errors import USER_ERROR_EXIT_CODE, error_line, report


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that its `finally` blocks and atomic writes clean up
    as for Ctrl-C."""


def interrupted_exit_code(interrupt):
    """The exit code of a tool ended by a KeyboardInterrupt: 143 for SIGTERM (Terminated),
    130 for Ctrl-C."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def _terminate(signum, frame):
    raise Terminated()


def interrupted_at_start(signum, frame):
    """The SIGINT and SIGTERM handler of a tool until run_cli runs its main (toolkit.base.runtime
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
#: that imports toolkit.base.runtime late, from its main, must not take them back).
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
    """An ArgumentParser whose errors are a user error's one line and exit code
    (the usage is in --help).

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
    have theirs stripped too, reading.lines_of); error(message) on an argument that is not
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
