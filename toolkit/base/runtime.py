"""The machine a tool runs on, and the process settings TensorFlow reads from the environment when
it starts.

Every entry point imports this module before TensorFlow (or any module that imports TensorFlow):

    from toolkit.base import runtime  # noqa: F401  (first: sets TensorFlow's environment defaults)

A variable the user has set keeps its value:
  TF_CPP_MIN_LOG_LEVEL=2           no TensorFlow C++ INFO/WARNING lines on the console.
  TF_CPU_ALLOCATOR_USE_BFC=true    CPU tensors come from TensorFlow's best-fit-with-coalescing
                                   allocator, which keeps the memory a step freed for the next
                                   step. Without it, oneDNN builds hand their large buffers back to
                                   the operating system after each use, so every step pays for
                                   hundreds of thousands of page faults on fresh memory (see
                                   docs/log/performance-log.md).

Importing this module also keeps TensorFlow from importing Keras (see KERAS_BLOCKED below), and
filters TensorFlow's start-up lines out of standard error when it is imported (see
QuietTensorFlowImport below).

The functions below read the CPU's instruction-set flags for --precision auto, size a session's
thread pools to the cores this process may use, and hand memory that start-up left resident back to
the operating system. Those that need TensorFlow import it when called, once the tool has loaded it.
"""
import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import signal
import sys
import tempfile

from toolkit.base import cli

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

#: The module TensorFlow imports eagerly when it is imported itself, to register Keras's optimizers
#: for Keras models; it brings in all of Keras (and matplotlib, h5py, rich): about 50 MB resident
#: and a second of every tool's start. No tool here uses Keras, so a None entry in sys.modules makes
#: that import fail, which TensorFlow catches and skips. A process that imported Keras before this
#: module keeps it; one that wants Keras after must import it first.
KERAS_BLOCKED = "keras.src.optimizers"
if "keras" not in sys.modules:
    sys.modules.setdefault(KERAS_BLOCKED, None)

#: Abseil's notice, written before TensorFlow's first start-up record, that it logs
#: before being initialized.
ABSL_NOTICE = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
               "STDERR")
#: The start of an Abseil log record (severity letter, date, time, thread, file:line]).
LOG_RECORD = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
#: The first line of a Python warning (warnings.formatwarning), which is never part of a record.
PYTHON_WARNING = re.compile(r".+:\d+: \w*Warning: ")
#: The record severities each TF_CPP_MIN_LOG_LEVEL leaves out, as TensorFlow's own logging reads it.
LEFT_OUT = {0: "", 1: "I", 2: "IW", 3: "IWE"}


def startup_lines_kept(lines, min_log_level):
    """The lines of standard error written while TensorFlow was imported, less the start-up records
    that min_log_level (TF_CPP_MIN_LOG_LEVEL) leaves out, each with its continuation lines, and less
    ABSL_NOTICE when any record is left out. TensorFlow's libraries write these as they load, before
    they read the variable: the oneDNN notice on every CPU where TensorFlow turns oneDNN on by
    default (AVX512-VNNI and later), the CPU feature guard's. A record's continuation lines are
    those up to the next record or Python warning. Anything else is kept, in order."""
    left_out, kept, dropping = LEFT_OUT[min(max(min_log_level, 0), 3)], [], False
    for line in lines:
        record = LOG_RECORD.match(line)
        if line.rstrip("\n") == ABSL_NOTICE:
            dropping = bool(left_out)
        elif record:
            dropping = record.group(1) in left_out
        elif PYTHON_WARNING.match(line):
            dropping = False
        if not dropping:
            kept.append(line)
    return kept


def writes_to_fd_2(stream):
    """Whether stream (sys.stderr) is a file on file descriptor 2, not a stand-in (pytest's)."""
    try:
        return stream.fileno() == 2
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def startup_lines_filtered():
    """Standard error (file descriptor 2, which TensorFlow's C++ writes to) goes to a temporary file
    inside the block; on leaving it, what startup_lines_kept keeps is written to standard error.
    Python's own lines (sys.stderr) go straight to standard error meanwhile: a line a signal
    handler prints while TensorFlow loads is never taken for a record's continuation, and survives
    an end that skips the filter."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no standard error to filter
        yield
        return
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as captured:
        if writes_to_fd_2(python_stderr):
            sys.stderr = open(saved, "w", buffering=1, encoding=python_stderr.encoding,
                              errors=python_stderr.errors, closefd=False)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            try:
                level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
            except ValueError:
                level = 0
            sys.stderr.write("".join(startup_lines_kept(lines, level)))
            sys.stderr.flush()


class QuietTensorFlowImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On the first `import tensorflow`, wherever it is, runs TensorFlow's __init__ inside
    startup_lines_filtered: the tools' standard error then holds their own lines only, whatever
    oneDNN setting TensorFlow starts with."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # TensorFlow's own loader, as without this
        module.__spec__.loader = module.__loader__ = self.loader
        with startup_lines_filtered():
            self.loader.exec_module(module)


if "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, QuietTensorFlowImport())


#: The repository's root, where the tools are.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def started_as_a_tool():
    """Whether this process runs one of the toolkit's scripts (a tool at the top, or scripts/), not
    a program that imports the toolkit (pytest, a user's own)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return bool(main) and os.path.dirname(os.path.realpath(main)) in (
        REPOSITORY, os.path.join(REPOSITORY, "scripts"))


# Ctrl-C or SIGTERM while the tool imports (TensorFlow takes seconds) is one line, as in its main
# (run_cli); a signal that the shell ignores (SIGINT of a background job) stays ignored, and so do
# the handlers of a main already running (a tool that imports this module from its main)
if started_as_a_tool() and not cli.main_running:
    for _signum, _default in ((signal.SIGINT, signal.default_int_handler),
                              (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(_signum) is _default:
            signal.signal(_signum, cli.interrupted_at_start)

def start_graph_mode():
    """The start of every tool's main that builds a TensorFlow graph: TF1 graph mode (the toolkit's
    graphs are tf.compat.v1's), a new empty default graph (a main may run more than once in a
    process, as the tests run it; a caller that entered a graph of its own, `with
    tf.Graph().as_default()`, keeps building in that one), and TensorFlow's Python logger at ERROR.
    TensorFlow's environment defaults were set when this module was imported, before TensorFlow."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    tf.compat.v1.disable_eager_execution()
    try:
        tf.compat.v1.reset_default_graph()
    except AssertionError:  # TensorFlow's refusal to reset inside a graph the caller entered
        pass
    tf.get_logger().setLevel("ERROR")
