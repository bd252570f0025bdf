"""The machine a tool runs on, and the process settings TensorFlow reads from the environment when it starts.

Every entry point imports this module before TensorFlow (or any module that imports TensorFlow):

    import runtime  # noqa: F401  (first: sets TensorFlow's environment defaults)

A variable the user has set keeps its value:
  TF_CPP_MIN_LOG_LEVEL=2           no TensorFlow C++ INFO/WARNING lines on the console.
  TF_CPU_ALLOCATOR_USE_BFC=true    CPU tensors come from TensorFlow's best-fit-with-coalescing allocator, which keeps
                                   the memory a step freed for the next step. Without it, oneDNN builds hand their
                                   large buffers back to the operating system after each use, so every step pays for
                                   hundreds of thousands of page faults on fresh memory (see docs/performance.md).

The functions below read the CPU's instruction-set flags for --precision auto and size a session's thread pools to
the cores this process may use. Those that need TensorFlow import it when called, once the tool has loaded it.
"""
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

#: CPU flags (as /proc/cpuinfo spells them) that give fast bfloat16 matrix products in oneDNN.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: The flags reports name: the vector ISA a CPU offers for matrix products.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
#: Values of ONEDNN_MAX_CPU_ISA that still allow oneDNN's native bfloat16 kernels (oneDNN's names, lowest first).
BF16_ISAS = ("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
             "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL")


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
    """Whether oneDNN runs bfloat16 matrix products natively: the CPU has avx512_bf16 or amx_bf16, and
    max_isa (the value of ONEDNN_MAX_CPU_ISA, None when unset) does not cap oneDNN below them."""
    if not any(flag in flags for flag in BF16_FLAGS):
        return False
    return max_isa is None or max_isa.strip().upper() in BF16_ISAS


def choose_precision(requested, flags, max_isa=None, has_gpu=False):
    """The --precision to train with, and a note for the user (None when there is nothing to say).

    requested: "auto", "fp32", "bf16" or "fp16". auto is fp16 with a GPU, bf16 on a CPU with native bfloat16
    (native_bf16), fp32 elsewhere. An explicit bf16 on a CPU without native bfloat16 is kept, with a note that it
    will run slower than fp32.
    """
    native = native_bf16(flags, max_isa)
    if requested == "auto":
        if has_gpu:
            return "fp16", "precision auto: fp16 (a GPU is visible)"
        if native:
            return "bf16", "precision auto: bf16 (this CPU has native bfloat16 matrix products)"
        why = ("ONEDNN_MAX_CPU_ISA=%s caps oneDNN below AVX512_CORE_BF16" % max_isa
               if any(flag in flags for flag in BF16_FLAGS) else "this CPU has no avx512_bf16 or amx_bf16")
        return "fp32", "precision auto: fp32 (%s)" % why
    if requested == "bf16" and not has_gpu and not native:
        return "bf16", ("warning: --precision bf16 on a CPU without native bfloat16 (avx512_bf16 or amx_bf16, not "
                        "capped by ONEDNN_MAX_CPU_ISA) emulates it and runs slower than fp32; use --precision auto")
    return requested, None


def usable_cores():
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow), else all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_precision(hp):
    """Replaces hp.precision "auto" by what this machine runs fastest (choose_precision) and prints the choice;
    prints a warning for an explicit bf16 that this CPU can only emulate."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    _, flags = cpu_info()
    hp.precision, note = choose_precision(hp.precision, flags, os.environ.get("ONEDNN_MAX_CPU_ISA"),
                                          bool(tf.config.list_physical_devices("GPU")))
    if note:
        print(note, file=sys.stderr)  # stderr: translate.py's stdout carries translations


def session_config(hp):
    """Session settings: --threads intra-op threads (0: every core) and as many inter-op threads, so that the
    small independent ops of a step (layer norms, softmaxes, bias adds, Adam's updates) overlap instead of queueing
    behind each other (docs/performance.md has the measurement)."""
    import tensorflow as tf  # here: this module is imported before TensorFlow
    threads = hp.threads or usable_cores()
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)


def machine_summary():
    """{"cpu": model name, "isa_flags": the REPORTED_FLAGS this CPU has, "onednn_max_cpu_isa": the cap or None,
    "cores": usable cores} for reports and benchmarks."""
    model, flags = cpu_info()
    return {"cpu": model, "isa_flags": [flag for flag in REPORTED_FLAGS if flag in flags],
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "cores": usable_cores()}


def onednn_isa():
    """The instruction set oneDNN reports using for its kernels in this environment (e.g. "Intel AVX2"), read from
    ONEDNN_VERBOSE output of a small matmul in a subprocess; None if it does not say."""
    code = ("import runtime, tensorflow as tf; tf.compat.v1.disable_eager_execution(); x = tf.ones([64, 64]); "
            "tf.compat.v1.Session().run(tf.matmul(x, x))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__)), env={**os.environ, "ONEDNN_VERBOSE": "1"})
    for line in (result.stdout + result.stderr).splitlines():
        if ",isa:" in line:
            return line.split(",isa:", 1)[1].strip()
    return None
