"""The machine a tool runs on, and the process settings TensorFlow reads from the environment when
it starts.

Every entry point imports this module before TensorFlow (or any module that imports TensorFlow):

    from toolkit import runtime  # noqa: F401  (first: sets TensorFlow's environment defaults)

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
import ctypes
import importlib.abc
import importlib.machinery
import os
import re
import signal
import subprocess
import sys
import tempfile

from toolkit import errors

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

#: Abseil's notice, written before TensorFlow's first start-up record, that it logs before being
#: initialized.
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


def started_as_a_tool():
    """Whether this process runs one of the toolkit's scripts (a tool at the top, or scripts/), not
    a program that imports the toolkit (pytest, a user's own)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return bool(main) and os.path.dirname(os.path.realpath(main)) in (root, os.path.join(root,
                                                                                         "scripts"))


# Ctrl-C or SIGTERM while the tool imports (TensorFlow takes seconds) is one line, as in its main
# (run_cli); a signal that the shell ignores (SIGINT of a background job) stays ignored, and so do
# the handlers of a main already running (a tool that imports this module from its main)
if started_as_a_tool() and not errors.main_running:
    for _signum, _default in ((signal.SIGINT, signal.default_int_handler),
                              (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(_signum) is _default:
            signal.signal(_signum, errors.interrupted_at_start)

#: CPU flags (as /proc/cpuinfo spells them) that give fast bfloat16 matrix products in oneDNN.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: The flags reports name: the vector ISA a CPU offers for matrix products.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
#: Values of ONEDNN_MAX_CPU_ISA that still allow oneDNN's native bfloat16 kernels (oneDNN's names,
#: lowest first).
BF16_ISAS = ("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX",
             "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL")


def cpu_info(path="/proc/cpuinfo"):
    """The CPU's model name and its set of flags, from the first processor listed in path.

    Returns ("unknown", set()) where the file is missing (not Linux).
    """
    model, flags = "unknown", set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def native_bf16(flags, max_isa=None):
    """Whether oneDNN runs bfloat16 matrix products natively: the CPU has avx512_bf16 or amx_bf16,
    and max_isa (the value of ONEDNN_MAX_CPU_ISA, None when unset) does not cap oneDNN below
    them."""
    if not any(flag in flags for flag in BF16_FLAGS):
        return False
    return max_isa is None or max_isa.strip().upper() in BF16_ISAS


def choose_precision(requested, flags, max_isa=None, has_gpu=False):
    """The --precision to train with, and a note for the user (None when there is nothing to say).

    requested: "auto", "fp32", "bf16" or "fp16". auto is fp16 with a GPU, bf16 on a CPU with native
    bfloat16 (native_bf16), fp32 elsewhere. An explicit bf16 on a CPU without native bfloat16 is
    kept, with a note that it will run slower than fp32.
    """
    native = native_bf16(flags, max_isa)
    if requested == "auto":
        if has_gpu:
            return "fp16", "precision auto: fp16 (a GPU is visible)"
        if native:
            return "bf16", "precision auto: bf16 (this CPU has native bfloat16 matrix products)"
        why = ("ONEDNN_MAX_CPU_ISA=%s caps oneDNN below AVX512_CORE_BF16" % max_isa
               if any(flag in flags for flag in BF16_FLAGS) else "this CPU has no avx512_bf16 or "
                                                                 "amx_bf16")
        return "fp32", "precision auto: fp32 (%s)" % why
    if requested == "bf16" and not has_gpu and not native:
        return "bf16", ("warning: --precision bf16 on a CPU without native bfloat16 (avx512_bf16 "
                        "or amx_bf16, not capped by ONEDNN_MAX_CPU_ISA) emulates it and runs "
                        "slower than fp32; use --precision auto")
    return requested, None


def usable_cores():
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow),
    else all."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_precision(hp):
    """Replaces hp.precision "auto" by what this machine runs fastest (choose_precision) and prints
    the choice; prints a warning for an explicit bf16 that this CPU can only emulate. The reference
    implementation (--impl reference) computes in float32: fp32, with a note when another precision
    was asked for."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    if hp.impl == "reference":
        if hp.precision not in ("auto", "fp32"):
            print("precision: fp32 (--impl reference computes in float32; --impl fast runs %s)"
                  % hp.precision, file=sys.stderr)
        hp.precision = "fp32"
        return
    _, flags = cpu_info()
    hp.precision, note = choose_precision(hp.precision, flags, os.environ.get("ONEDNN_MAX_CPU_ISA"),
                                          bool(tf.config.list_physical_devices("GPU")))
    if note:
        print(note, file=sys.stderr)  # stderr: translate.py's stdout carries translations


def session_config(hp):
    """Session settings: --threads intra-op threads (0: every core) and as many inter-op threads, so
    that the small independent ops of a step (layer norms, softmaxes, bias adds, Adam's updates)
    overlap instead of queueing behind each other (docs/log/performance-log.md has the
    measurement)."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    threads = hp.threads or usable_cores()
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                    inter_op_parallelism_threads=threads)


def machine_summary():
    """{"cpu": model name, "isa_flags": the REPORTED_FLAGS this CPU has, "onednn_max_cpu_isa": the
    cap or None, "cores": usable cores} for reports and benchmarks."""
    model, flags = cpu_info()
    return {"cpu": model, "isa_flags": [flag for flag in REPORTED_FLAGS if flag in flags],
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "cores": usable_cores()}


def onednn_isa():
    """The instruction set oneDNN reports using for its kernels in this environment (e.g. "Intel
    AVX2"), read from ONEDNN_VERBOSE output of a small matmul in a subprocess; None if it does not
    say."""
    code = ("import toolkit.runtime, tensorflow as tf; tf.compat.v1.disable_eager_execution(); x = "
            "tf.ones([64, 64]); tf.compat.v1.Session().run(tf.matmul(x, x))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            env={**os.environ, "ONEDNN_VERBOSE": "1"})
    for line in (result.stdout + result.stderr).splitlines():
        if ",isa:" in line:
            return line.split(",isa:", 1)[1].strip()
    return None


def release_freed_memory():
    """Returns the heap memory that has been freed but is still held by the C library to the
    operating system (glibc's malloc_trim), so that it stops counting in the resident set. The first
    run of a graph in a session optimizes the graph and builds its kernels, and the memory that work
    frees stays with glibc's arenas: about 40 MB for the training step. TensorFlow's own tensor pool
    is not glibc's and is kept. Returns whether it could call malloc_trim (not on C libraries
    without it)."""
    try:
        # None: the symbols already loaded, the C library's among them
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


#: madvise's advice to reclaim pages now (Linux 5.4 and later): clean pages of a file are dropped at
#: once.
MADV_PAGEOUT = 21


def library_mappings(maps="/proc/self/maps"):
    """(start, end) of this process's read-only mappings of shared libraries (.so files), from
    maps."""
    ranges = []
    with open(maps) as f:
        for line in f:
            fields = line.split()
            readonly = len(fields) >= 6 and fields[1] in ("r-xp", "r--p")
            if readonly and ".so" in os.path.basename(fields[5]):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def release_library_pages():
    """Asks the kernel to reclaim this process's pages of its shared libraries' code and read-only
    data (madvise MADV_PAGEOUT), so that they stop counting in the resident set. Importing
    TensorFlow reads about 330 MB of its library (every op's and kernel's registration, static
    initializers); a training step runs a few tens of MB of it. The pages are the library file's
    own, never written: the kernel drops them and reads back from the file any page that is run
    again, so nothing is lost. Pages another process maps too are left alone. Returns the MiB of
    mappings advised, 0 where the system cannot (not Linux, or a kernel older than 5.4)."""
    try:
        madvise = ctypes.CDLL(None).madvise
        ranges = library_mappings()
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = sum(end - start for start, end in ranges if madvise(start, end - start, MADV_PAGEOUT)
                  == 0)
    return advised >> 20


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
