"""The toolkit's own CPU kernels (fast/csrc/*.cc): a training step's elementwise chains in one pass
over memory each, where TensorFlow runs one op, and one pass, per operation.

    ops = kernels.load()        # builds the library with g++ on first use; KernelsUnavailable
    y = residual_dropout_ln(x, f, b, gamma, beta, rate, epsilon)     # LN(x + dropout(f + b))
    attention, dropped = attention_softmax_dropout(s, biases, scale, causal, rate)  # and dropout
    losses, probs = smoothed_cross_entropy(logits, labels, logit_means, epsilon)  # output loss
    total = accumulate(total, addend)              # float32 total + 16-bit addend, in place
    total = scatter_add_rows(total, ids, rows, scale)   # total[ids[k]] += scale * rows[k], in place
    q, k, v = split_heads(x, num_heads, parts=3)   # (N, T, 3*d) -> 3 x (N*h, T, d/h)
    y = embedding_dropout(e, encodings, scale, rate)   # dropout(e * scale + PE)
    optimizer = OnePassAdam(lr, beta1, beta2, epsilon)  # Adam's update in one pass per variable

Each kernel has its gradient fused too; merge_heads is split_heads' inverse.

The library is built against the installed TensorFlow, for this CPU (-march=native less AVX512-FP16,
capped like oneDNN by ONEDNN_MAX_CPU_ISA), from one translation unit (csrc/kernels.cc), into build/
beside this file, under a name that hashes the source, TensorFlow's version and the compiler
command; a later load finds it there. A build that fails is remembered beside it, so that later
processes fall back to TensorFlow's ops at once with the same line. `python -m fast.kernels
--check_targets` compiles the kernels for every x86 class (TARGETS) without running them.
fast.layers (projected_sublayer_output, scaled_dot_product_attention, the heads' fused_heads,
split_heads, merge_heads), fast.loss.output_loss, and fast.model.FastTransformer's embedding and its
gradient (tied_embeddings) and optimizer (OnePassAdam) use these kernels in training when the
model's config says "fused" (--kernels, resolved by fast.resolved_kernels); the TensorFlow ops they
replace stay the reference that tests/test_kernels.py holds them to.
"""
import argparse
import concurrent.futures
import functools
import glob
import hashlib
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

# first: TensorFlow's environment defaults, its start-up lines filtered
from toolkit.base import runtime  # noqa: F401
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: The one translation unit g++ compiles (it includes the others), and every file
#: the build depends on.
UNIT = os.path.join(HERE, "csrc", "kernels.cc")
SOURCES = [os.path.join(HERE, "csrc", name)
           for name in ("residual_dropout_ln.cc", "attention_softmax_dropout.cc",
                        "smoothed_cross_entropy.cc", "accumulate.cc", "embedding_dropout.cc",
                        "scatter_add_rows.cc", "heads.cc", "adam.cc")]
HEADERS = [os.path.join(HERE, "csrc", "common.h")]
BUILD_DIR = os.path.join(os.path.dirname(HERE), "build")
GOLDEN = 0x9E3779B97F4A7C15  # the seed stream's increment in the kernels' keep decisions


class KernelsUnavailable(Exception):
    """The kernels could not be built or loaded here; the message says why in one line."""


#: Left out of every target: AVX512-FP16. The kernels do no float16 arithmetic of their own, and
#: with it g++ 12 cannot compile the Eigen that TensorFlow ships
#: (Eigen/src/Core/arch/AVX512/PacketMathFP16.h), which would leave every CPU that has it (each one
#: with AMX) on TensorFlow's ops.
EXCLUDED_FLAGS = ["-mno-avx512fp16"]
#: AMX's tile instructions: the kernels do not use them, and a cap below AMX leaves them out.
NO_AMX = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]
#: What g++ must leave out under each ONEDNN_MAX_CPU_ISA cap below AMX (oneDNN's names), so that no
#: instruction set above the cap is defined; g++ drops what depends on them too (-mno-avx512f drops
#: every AVX-512 extension).
ISA_CAP_FLAGS = {"SSE41": ["-mno-avx", "-mno-fma"] + NO_AMX, "AVX": ["-mno-avx2", "-mno-fma"]
                 + NO_AMX, "AVX2": ["-mno-avx512f", "-mno-avxvnni"] + NO_AMX,
                 "AVX2_VNNI": ["-mno-avx512f"] + NO_AMX, "AVX2_VNNI_2": ["-mno-avx512f"] + NO_AMX,
                 "AVX512_CORE": ["-mno-avx512bf16"] + NO_AMX,
                 "AVX512_CORE_VNNI": ["-mno-avx512bf16"] + NO_AMX, "AVX512_CORE_BF16": NO_AMX,
                 "AVX10_1_512": NO_AMX, "AVX512_CORE_FP16": NO_AMX}
#: The x86 classes the kernels are built for, by the g++ -march that stands for each: one per set of
#: Eigen vectorization paths (AVX2 with FMA; AVX-512; AVX-512 with bfloat16; AMX with AVX512-FP16).
#: check_targets compiles each (syntax only, nothing runs) on any x86 machine.
TARGETS = {"x86-64-v3": "AVX2 (Haswell, Zen 1-3)",
           "skylake-avx512": "AVX-512 (Skylake-SP, Ice Lake)",
           "cooperlake": "AVX-512 with BF16 (Cooper Lake)",
           "sapphirerapids": "AMX and AVX512-FP16 (Sapphire Rapids)"}
#: Classes checked too where the compiler knows them (g++ 13 and later): g++ 12 builds for them
#: through -march=native's flags, which are those of a class above.
NEWER_TARGETS = {"znver4": "AVX-512 with BF16 (Zen 4)",
                 "graniterapids": "AMX-FP16 (Granite Rapids)"}


def compiler():
    """The C++ compiler: $CXX, else g++."""
    return os.environ.get("CXX") or "g++"


def target_flags(max_isa, march="native"):
    """The g++ target for the CPU `march` names (this one by default), less EXCLUDED_FLAGS and
    capped like oneDNN by max_isa (the value of ONEDNN_MAX_CPU_ISA, None when unset), so that a
    capped run emulates the lesser CPU in the kernels too, not only in the matrix products."""
    return ["-march=" + march] + EXCLUDED_FLAGS + ISA_CAP_FLAGS.get((max_isa or "").strip().upper(),
                                                                    [])


def compile_command(output, march="native"):
    """The g++ command that builds UNIT into output against the installed TensorFlow, for this CPU
    under the ONEDNN_MAX_CPU_ISA cap (target_flags). -fno-math-errno: a square root that need not
    set errno, so that the loops taking one vectorize."""
    return ([compiler(), "-std=c++17", "-shared", "-fPIC", "-O3"]
            + target_flags(os.environ.get("ONEDNN_MAX_CPU_ISA"), march)
            + ["-fopenmp-simd", "-fno-math-errno", "-w", UNIT, "-o", output]
            + tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())


def library_stem():
    """"kernels", or "kernels-avx2" (say) for a build under an ONEDNN_MAX_CPU_ISA cap that changes
    the target: each target keeps its own build, so that capped and uncapped runs can take turns
    without rebuilding."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or "").strip().upper()
    return "kernels-%s" % cap.lower() if cap in ISA_CAP_FLAGS else "kernels"


def library_path():
    """build/<stem>-<hash>.so: the hash covers the sources, TensorFlow's version, the command and
    the machine."""
    digest = hashlib.sha256()
    for source in [UNIT] + SOURCES + HEADERS:
        with open(source, "rb") as f:
            digest.update(f.read())
    key = [tf.__version__, platform.machine(), platform.node()] + compile_command("")
    digest.update(" ".join(key).encode())
    return os.path.join(BUILD_DIR, "%s-%s.so" % (library_stem(), digest.hexdigest()[:16]))


def failure_path(path):
    """Where a failed build of the library `path` is remembered: build/<stem>-<hash>.failed, keyed
    like the build, so that a change of source, TensorFlow, compiler or cap tries again."""
    return path[:-len(".so")] + ".failed"


def remove_stale(path):
    """Removes this target's builds and remembered failures of older sources (other keys
    of path's stem)."""
    stem = os.path.basename(path).rsplit("-", 1)[0]
    for stale in glob.glob(os.path.join(BUILD_DIR, stem + "-*")):
        key, extension = os.path.splitext(stale)
        if (extension in (".so", ".failed") and key != path[:-len(".so")]
                and os.path.basename(key).rsplit("-", 1)[0] == stem):
            os.remove(stale)


def remember_failure(path, reason):
    """The one line of a failed build, with how to try again, written to failure_path(path) (best
    effort: a process that cannot write it only fails to spare the next one the compile)."""
    failed = failure_path(path)
    line = "%s (remembered: delete %s to try the build again)" % (reason, failed)
    try:
        with tempfile.NamedTemporaryFile("w", dir=BUILD_DIR, suffix=".failed.partial",
                                         delete=False) as f:
            f.write(line + "\n")
        os.replace(f.name, failed)
    except OSError:
        pass
    return line


def remembered_failure(path):
    """The line of a failed build of `path` that remember_failure wrote, or None."""
    try:
        with open(failure_path(path), encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def first_error(result):
    """The first error line of a compiler run that failed (its subprocess.CompletedProcess)."""
    return next((line for line in result.stderr.splitlines() if "error" in line),
                result.stderr.strip()[:200] or "exit status %d" % result.returncode)


def build(path):
    """Compiles the library to path (atomically: processes that build at once each write their own
    file). A compiler that runs and fails is remembered (remember_failure); one that is missing is
    not, as finding that out costs nothing."""
    try:
        os.makedirs(BUILD_DIR, exist_ok=True)
        handle, partial = tempfile.mkstemp(suffix=".so", dir=BUILD_DIR)
    except OSError as e:  # a read-only checkout: as without g++, TensorFlow's ops
        raise KernelsUnavailable("cannot write the build in %s (%s)"
                                 % (BUILD_DIR, e.strerror)) from None
    os.close(handle)
    try:
        result = subprocess.run(compile_command(partial), capture_output=True, text=True)
    except OSError as e:  # no g++
        os.remove(partial)
        raise KernelsUnavailable("could not run %s (%s)" % (compiler(), e.strerror)) from None
    if result.returncode != 0:
        os.remove(partial)
        remove_stale(path)
        raise KernelsUnavailable(remember_failure(path, "%s failed: %s" % (compiler(),
                                                                           first_error(result))))
    os.replace(partial, path)
    remove_stale(path)


@functools.lru_cache(maxsize=None)
def load():
    """The loaded op library (building it first if build/ lacks it and no failed build of it is
    remembered). Raises KernelsUnavailable."""
    path = library_path()
    if not os.path.exists(path):
        remembered = remembered_failure(path)
        if remembered:
            raise KernelsUnavailable(remembered)
        build(path)
    try:
        return tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        raise KernelsUnavailable("TensorFlow could not load %s: %s"
                                 % (path, e.message.splitlines()[0]))


def choose_kernels(requested, has_gpu):
    """The --kernels to train with ("fused" or "tf") and a note for the user (None when there is
    nothing to say). auto is fused when the library builds and loads on this CPU (no GPU kernels
    exist), else tf."""
    if requested == "tf":
        return "tf", None
    if has_gpu:
        return "tf", ("kernels auto: TensorFlow's ops (the fused kernels are CPU kernels and a GPU "
                      "is visible)")
    try:
        load()
    except KernelsUnavailable as e:
        return "tf", ("kernels auto: TensorFlow's ops (the fused CPU kernels are unavailable: %s)"
                      % e)
    return "fused", None


def chosen_kernels(requested):
    """--kernels "auto", "fused" or "tf" resolved on this machine (choose_kernels), printing why
    when it falls back."""
    kernels, note = choose_kernels(requested, bool(tf.config.list_physical_devices("GPU")))
    if note:
        print(note, file=sys.stderr)
    return kernels


def dropout_seed():
    """A fresh (2,) int32 seed per step from the graph's random stream
    (tf1.set_random_seed repeats it)."""
    return tf.random.uniform([2], maxval=np.iinfo(np.int32).max, dtype=tf.int32)


def residual_dropout_ln(inputs, outputs, outputs_bias, gamma, beta, rate, epsilon=1e-6):
    """LN(x + dropout(f + b)) of a post-layer-norm sublayer (Sections 3.1 and 5.4) in one kernel,
    forward and backward; f + b is the sublayer's last dense layer, its bias added here in float32
    rather than after the product, so that the backward kernel sums the bias's gradient as
    it writes f's.

    inputs: (..., d) float32, the sublayer's input x. outputs: (..., d) f in float32, bfloat16 or
    float16 (the last product, without its bias). outputs_bias: (d,) float32, b. gamma, beta: (d,)
    float32. rate: the dropout rate (a Python float). Returns (..., d) float32: what
    modules.ln(inputs + modules.dropout(f + b, rate, True)) computes, but with keep decisions of its
    own (keep_decisions) that the backward kernel draws again instead of storing.
    """
    y, _, _ = load().residual_dropout_ln(inputs, outputs, outputs_bias, gamma, beta, dropout_seed(),
                                         rate=rate, epsilon=epsilon)
    return y


@tf.RegisterGradient("ResidualDropoutLn")
def _residual_dropout_ln_grad(op, dy, *_):
    """Gradients of x, f, b, gamma and beta from the saved x_hat and rstd and the same seed (none
    for the seed)."""
    _, x_hat, rstd = op.outputs
    gamma, seed = op.inputs[3], op.inputs[5]
    dx, df, df_bias, dgamma, dbeta = load().residual_dropout_ln_grad(dy, x_hat, rstd, gamma, seed,
                                                                     T=op.get_attr("T"),
                                                                     rate=op.get_attr("rate"))
    return dx, df, df_bias, dgamma, dbeta, None


def attention_softmax_dropout(scores, biases, scale, causal, rate):
    """The attention weights softmax(scale * scores + masks) and their dropout (Sections 3.2.1 and
    5.4) in one kernel, forward and backward.

    scores: (N, T_q, T_k) Q K^T in float32, bfloat16 or float16. biases: (N or 1, 1, T_k) float32,
    MASKED_LOGIT at the keys not to attend to, else 0 (fast.layers.key_biases). scale: 1/sqrt(d_k).
    causal: if True, query t attends only to keys <= t. rate: the dropout rate. Returns the weights
    (N, T_q, T_k) float32, without a gradient, and the dropped-out weights (N, T_q, T_k) in the
    scores' dtype, with keep decisions of their own (keep_decisions).
    """
    attention, dropped = load().attention_softmax_dropout(scores, biases, dropout_seed(),
                                                          scale=scale, rate=rate, causal=causal)
    return tf.stop_gradient(attention), dropped


@tf.RegisterGradient("AttentionSoftmaxDropout")
def _attention_softmax_dropout_grad(op, _, d_dropped):
    """The scores' gradient from the saved weights and the same seed (none for the biases or the
    seed). The weights themselves are returned without a gradient: training's loss uses only the
    dropped-out weights."""
    d_scores = load().attention_softmax_dropout_grad(d_dropped, op.outputs[0], op.inputs[2],
                                                     scale=op.get_attr("scale"),
                                                     rate=op.get_attr("rate"))
    return d_scores, None, None


def smoothed_cross_entropy(logits, labels, logit_means, epsilon):
    """loss.smoothed_cross_entropy in one kernel that reads the logits in their own
    dtype (Section 5.4).

    logits: (M, V) float32, bfloat16 or float16. labels: (M,) int32. logit_means: (M,) float32, each
    row's mean logit. Returns losses (M,) float32 and p = softmax(logits) (M, V) in the logits'
    dtype. No gradient: the caller (loss.output_loss) applies p in its own gradient.
    """
    return load().smoothed_cross_entropy(logits, labels, logit_means, epsilon=epsilon)


def embedding_dropout(embedded, encodings, scale, rate):
    """dropout(embedded * scale + encodings) (Sections 3.4, 3.5 and 5.4) in one kernel, forward
    and backward.

    embedded: (N, T, d) float32, the embedding rows of the ids. encodings: (T, d) float32, the
    positional encodings (no gradient). scale: sqrt(d_model). rate: the dropout rate (a Python
    float). Returns (N, T, d) float32: what modules.dropout(embedded * scale + encodings, rate,
    True) computes, but with keep decisions of its own (keep_decisions) that the backward kernel
    draws again instead of storing.
    """
    return load().embedding_dropout(embedded, encodings, dropout_seed(), scale=scale, rate=rate)


@tf.RegisterGradient("EmbeddingDropout")
def _embedding_dropout_grad(op, dy):
    """The embedding rows' gradient from the same seed (none for the encodings or the seed)."""
    return (load().embedding_dropout_grad(dy, op.inputs[2], scale=op.get_attr("scale"),
                                          rate=op.get_attr("rate")),
            None, None)


def accumulate(total, addend):
    """total + tf.cast(addend, tf.float32) in one pass, written over total's buffer when nothing
    else holds it.

    total: float32, any shape. addend: the same shape in bfloat16 or float16. Returns float32. No
    gradient: the caller (loss.output_loss) sums its own gradients with it."""
    return load().accumulate(total, addend)


def scatter_add_rows(total, indices, rows, scale=1.0):
    """total with scale * rows[k] added to its row indices[k] for every k (repeated indices add up),
    in one pass over the rows, written over total's buffer when nothing else holds it.

    total: (V, d) float32. indices: (K,) int32 or int64, each in [0, V). rows: (K, d) float32,
    bfloat16 or float16.
    scale: a Python float. Returns (V, d) float32. No gradient: the callers (loss.output_loss,
    model.tied_embeddings) sum gradients with it."""
    return load().scatter_add_rows(total, indices, rows, scale=scale)


def split_heads(x, num_heads, parts=1):
    """The P = parts projections side by side in x, each split into heads (Section 3.2.2),
    by one copy.

    x: (N, T, P * d) float32, bfloat16 or float16. Returns a list of P tensors (N*h, T, d/h): what
    modules.fused_heads makes of its product with TensorFlow's ops (P = 1: modules.split_heads)."""
    return load().split_heads(x, num_heads=num_heads, parts=parts)


def merge_heads(heads, num_heads):
    """The inverse of split_heads: P tensors (N*h, T, d/h) -> (N, T, P * d) (P = 1:
    modules.merge_heads)."""
    return load().merge_heads(heads, num_heads=num_heads)


@tf.RegisterGradient("SplitHeads")
def _split_heads_grad(op, *grads):
    """The parts' gradients merged back into rows; a part with none (unused) counts as zeros."""
    grads = [tf.zeros_like(out) if grad is None else grad for grad, out in zip(grads, op.outputs)]
    return merge_heads(grads, op.get_attr("num_heads"))


@tf.RegisterGradient("MergeHeads")
def _merge_heads_grad(op, grad):
    return split_heads(grad, op.get_attr("num_heads"), len(op.inputs))


class OnePassAdam(tf.compat.v1.train.AdamOptimizer):
    """tf1.train.AdamOptimizer whose dense updates of float32 variables (every variable the model
    trains) run one kernel (AdamOnePass) that reads each entry's gradient, moments and weight once
    and writes them once, where ResourceApplyAdam makes three passes. The update is the same bit for
    bit, and the slots and accumulators are AdamOptimizer's own, so checkpoints do not change.
    Sparse updates stay AdamOptimizer's."""

    def _resource_apply_dense(self, grad, var):
        beta1_power, beta2_power = self._get_beta_accumulators()
        return load().adam_one_pass(var.handle, self.get_slot(var, "m").handle,
                                    self.get_slot(var, "v").handle, beta1_power, beta2_power,
                                    self._lr_t, self._beta1_t, self._beta2_t, self._epsilon_t, grad,
                                    use_locking=self._use_locking)


def keep_decisions(seed, shape, rate):
    """The kernels' keep decisions for a tensor of `shape`, computed with numpy: entry i (row-major)
    is kept when the 16-bit lane i % 4 of mix(key + (i // 4 + 1) * GOLDEN) is at least round(rate *
    2^16) - 2^15, with mix SplitMix64's finalizer and key the two seed words. seed: two int32.
    Returns a bool array of `shape`."""
    key = np.uint64((int(seed[0]) & 0xFFFFFFFF) << 32 | (int(seed[1]) & 0xFFFFFFFF))
    words = np.arange((int(np.prod(shape)) + 3) // 4, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        z = key + words * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    draws = z.view(np.int16)[:int(np.prod(shape))]  # little-endian: lane 0 is the lowest 16 bits
    return (draws >= int(round(rate * 2 ** 16)) - 2 ** 15).reshape(shape)


def knows_target(march):
    """Whether the compiler accepts -march=march (False without a compiler)."""
    try:
        result = subprocess.run([compiler(), "-march=" + march, "-E", "-x", "c++", os.devnull],
                                capture_output=True)
    except OSError:
        return False
    return result.returncode == 0


def check_command(march):
    """The compiler command that checks UNIT for the CPU class -march=march (target_flags, uncapped)
    against the installed TensorFlow: syntax and templates only, no code generated, so any x86
    machine checks any class."""
    return ([compiler(), "-std=c++17", "-fsyntax-only"] + target_flags(None, march) + ["-w", UNIT]
            + tf.sysconfig.get_compile_flags())


def check_target(march):
    """(True, "") when UNIT compiles for -march=march, else (False, the compiler's
    first error line)."""
    result = subprocess.run(check_command(march), capture_output=True, text=True)
    if result.returncode == 0:
        return True, ""
    return False, first_error(result)


def targets():
    """{-march: the class it stands for} of TARGETS and of the NEWER_TARGETS the compiler knows."""
    return {**TARGETS,
            **{march: name for march, name in NEWER_TARGETS.items() if knows_target(march)}}


def check_targets(marches):
    """Checks every target of marches side by side (one compiler per core); prints a line each and
    returns whether all compiled."""
    names = {**TARGETS, **NEWER_TARGETS}
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(marches, pool.map(check_target, marches)))
    for march, (ok, error) in results.items():
        print("%-15s %s: %s"
              % (march, names.get(march, ""), "compiles" if ok else "FAILS: " + error))
    return all(ok for ok, _ in results.values())


def main(argv=None):
    """`python -m fast.kernels`: builds the library if build/ lacks it and says whether training
    will use it; with --check_targets, compiles the kernels for every x86 class instead."""
    parser = argparse.ArgumentParser(prog="python -m fast.kernels", description=main.__doc__)
    parser.add_argument("--check_targets", nargs="*", metavar="MARCH",
                        help="compile (syntax only: nothing runs) for these g++ -march targets, by "
                             "default every class the kernels are built for: %s, and %s where the "
                             "compiler knows them; exit status 1 if one fails"
                        % (", ".join(TARGETS), " and ".join(NEWER_TARGETS)))
    args = parser.parse_args(argv)
    if args.check_targets is not None:
        return 0 if check_targets(args.check_targets or list(targets())) else 1
    try:
        load()
    except KernelsUnavailable as e:
        print("kernels: unavailable (%s); training runs TensorFlow's ops instead" % e)
        return 0
    print("kernels: %s" % os.path.relpath(library_path(), os.path.dirname(HERE)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
