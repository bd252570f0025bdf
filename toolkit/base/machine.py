"""The machine a tool runs on: the CPU's instruction-set flags and the --precision they make
fastest, the cores this process may use and the session threads sized to them, the summary that
reports and benchmarks print, and the memory that start-up left resident handed back to the
operating system. The functions that need TensorFlow import it when called, once the tool has
loaded it."""
import ctypes
import os
import subprocess
import sys

from toolkit.base.runtime import REPOSITORY


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
    and max_isa (the value of ONEDNN_MAX_CPU_ISA, None when unset) does not cap oneDNN
    below them."""
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


def resolved_precision(impl, precision):
    """--precision resolved for --impl on this machine: "auto" becomes what it runs fastest
    (choose_precision), and the choice is printed; an explicit bf16 that this CPU can only emulate
    gets a warning. The reference implementation computes in float32: fp32, with a note when another
    precision was asked for."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    if impl == "reference":
        if precision not in ("auto", "fp32"):
            print("precision: fp32 (--impl reference computes in float32; --impl fast runs %s)"
                  % precision, file=sys.stderr)
        return "fp32"
    _, flags = cpu_info()
    precision, note = choose_precision(precision, flags, os.environ.get("ONEDNN_MAX_CPU_ISA"),
                                       bool(tf.config.list_physical_devices("GPU")))
    if note:
        print(note, file=sys.stderr)  # stderr: translate.py's stdout carries translations
    return precision


def session_config(hp):
    """Session settings: --threads intra-op threads (0: every core) and as many inter-op threads, so
    that the small independent ops of a step (layer norms, softmaxes, bias adds, Adam's updates)
    overlap instead of queueing behind each other
    (docs/log/performance-log.md has the measurement)."""
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
    """The instruction set oneDNN reports using for its kernels in this environment
    (e.g. "Intel AVX2"), read from ONEDNN_VERBOSE output of a small matmul in a subprocess;
    None if it does not say."""
    code = ("import toolkit.base.runtime, tensorflow as tf; "
            "tf.compat.v1.disable_eager_execution(); x = "
            "tf.ones([64, 64]); tf.compat.v1.Session().run(tf.matmul(x, x))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPOSITORY,
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


#: madvise's advice to reclaim pages now (Linux 5.4 and later): clean pages of a file are
#: dropped at once.
MADV_PAGEOUT = 21


def library_mappings(maps="/proc/self/maps"):
    """(start, end) of this process's read-only mappings of shared libraries (.so files),
    from maps."""
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
