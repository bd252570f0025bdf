"""fast/kernels.py's fused kernels against the TensorFlow ops they replace, with the same keep decisions."""
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from fast import kernels
from fast.layers import mask_future
from fast.loss import smoothed_cross_entropy
from model_fixtures import fused_kernels
from modules import MASKED_LOGIT, ln

tf1 = tf.compat.v1


@pytest.fixture(scope="module")
def ops():
    return fused_kernels()


def fused_and_reference(x, f, rate, seed, dtype=tf.float32):
    """Outputs and gradients (x, f, f_bias, gamma, beta) of the fused kernel and of LN(x + (f + f_bias) * keep /
    (1 - rate)) in TensorFlow's ops with keep = kernels.keep_decisions(seed, ...), under the same f_bias, gamma,
    beta and upstream gradient."""
    rng = np.random.RandomState(7)
    gamma, beta = 1 + 0.1 * rng.randn(x.shape[-1]), 0.1 * rng.randn(x.shape[-1])
    f_bias = rng.randn(x.shape[-1])
    upstream = rng.randn(*x.shape).astype(np.float32)
    keep = kernels.keep_decisions(seed, x.shape, rate)
    results = []
    for fused in (True, False):
        with tf.Graph().as_default(), tf1.Session() as sess:
            xs, fs = tf.constant(x), tf.constant(f, dtype)
            fb = tf.constant(f_bias, tf.float32)
            with tf1.variable_scope("ln"):
                g = tf1.get_variable("gamma", initializer=gamma.astype(np.float32))
                b = tf1.get_variable("beta", initializer=beta.astype(np.float32))
            if fused:
                y, _, _ = kernels.load().residual_dropout_ln(xs, fs, fb, g, b, tf.constant(seed, tf.int32),
                                                             rate=rate, epsilon=1e-6)
            else:
                y = ln(xs + tf.where(keep, (tf.cast(fs, tf.float32) + fb) / (1 - rate), 0.0))
            grads = tf.gradients(y, [xs, fs, fb, g, b], upstream)
            sess.run(tf1.global_variables_initializer())
            results.append(sess.run([y] + [tf.cast(grad, tf.float32) for grad in grads]))
    return results


@pytest.mark.parametrize("shape,rate", [((3, 5, 16), 0.1), ((7, 33), 0.3), ((1, 2, 8), 0.0), ((130, 12), 0.5)])
def test_residual_dropout_ln_matches_tensorflow_ops(ops, shape, rate):
    rng = np.random.RandomState(sum(shape))
    x, f = rng.randn(*shape).astype(np.float32), rng.randn(*shape).astype(np.float32)
    fused, reference = fused_and_reference(x, f, rate, (12345, -678))
    for name, a, b in zip(["y", "dx", "df", "df_bias", "dgamma", "dbeta"], fused, reference):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)


def test_residual_dropout_ln_takes_16_bit_sublayer_outputs(ops):
    rng = np.random.RandomState(3)
    x, f = rng.randn(4, 9, 32).astype(np.float32), rng.randn(4, 9, 32).astype(np.float32)
    for dtype in (tf.bfloat16, tf.float16):
        fused, reference = fused_and_reference(x, f, 0.1, (1, 2), dtype)
        for name, a, b in zip(["y", "dx", "df", "df_bias", "dgamma", "dbeta"], fused, reference):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2, err_msg="%s %s" % (dtype.name, name))


def attention_fused_and_reference(ops, scores, biases, causal, rate, seed, dtype=tf.float32):
    """Weights, dropped-out weights and the scores' gradient of the fused kernel and of TensorFlow's ops
    (softmax(scale * scores + biases [+ mask_future]), dropped out with keep = kernels.keep_decisions(seed, ...)),
    under the same upstream gradient of the dropped-out weights."""
    scale = 0.25
    upstream = np.random.RandomState(5).randn(*scores.shape).astype(np.float32)
    keep = kernels.keep_decisions(seed, scores.shape, rate)
    results = []
    for fused in (True, False):
        with tf.Graph().as_default(), tf1.Session() as sess:
            s = tf.constant(scores, dtype)
            if fused:
                attention, dropped = ops.attention_softmax_dropout(s, biases, tf.constant(seed), scale=scale,
                                                                   rate=rate, causal=causal)
            else:
                logits = tf.cast(s, tf.float32) * scale + biases
                attention = tf.nn.softmax(mask_future(logits) if causal else logits)
                dropped = tf.where(keep, tf.cast(attention / (1 - rate), dtype), tf.zeros([], dtype))
            grad = tf.gradients(dropped, s, tf.cast(upstream, dtype))[0]
            results.append(sess.run([attention] + [tf.cast(t, tf.float32) for t in (dropped, grad)]))
    return results


@pytest.mark.parametrize("shape,causal,rate", [((6, 5, 7), False, 0.1), ((4, 9, 9), True, 0.3),
                                               ((2, 1, 3), False, 0.0), ((3, 70, 70), True, 0.1)])
def test_attention_softmax_dropout_matches_tensorflow_ops(ops, shape, causal, rate):
    rng = np.random.RandomState(sum(shape))
    scores = 4 * rng.randn(*shape).astype(np.float32)
    padding = rng.rand(shape[0], 1, shape[2]) < 0.3
    padding[:, :, 0] = False  # every query has a key to attend to
    fused, reference = attention_fused_and_reference(ops, scores, np.where(padding, MASKED_LOGIT, 0).astype(np.float32),
                                                       causal, rate, (9, -8))
    for name, a, b in zip(["attention", "dropped", "d_scores"], fused, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_attention_softmax_dropout_takes_16_bit_scores_and_one_bias_row(ops):
    rng = np.random.RandomState(4)
    scores, biases = rng.randn(8, 6, 10).astype(np.float32), np.zeros((1, 1, 10), np.float32)
    for dtype in (tf.bfloat16, tf.float16):
        fused, reference = attention_fused_and_reference(ops, scores, biases, True, 0.1, (3, 3), dtype)
        for name, a, b in zip(["attention", "dropped", "d_scores"], fused, reference):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2, err_msg="%s %s" % (dtype.name, name))


@pytest.mark.parametrize("dtype,tolerance", [(tf.float32, 1e-5), (tf.bfloat16, 2e-2)])
def test_smoothed_cross_entropy_matches_tensorflow_ops(ops, dtype, tolerance):
    rng = np.random.RandomState(11)
    logits = 5 * rng.randn(37, 301).astype(np.float32)
    logits[3, 7] = 200.0  # a row whose other tokens underflow: loss capped, softmax exactly one-hot
    labels = rng.randint(0, 301, size=37).astype(np.int32)
    labels[3] = 8
    means = logits.mean(axis=1)
    with tf.Graph().as_default(), tf1.Session() as sess:
        z = tf.cast(tf.constant(logits), dtype)
        fused = ops.smoothed_cross_entropy(z, labels, means, epsilon=0.2)
        reference = smoothed_cross_entropy(tf.cast(z, tf.float32), labels, means, epsilon=0.2)
        (losses, probs), (ref_losses, ref_probs) = sess.run([[fused[0], tf.cast(fused[1], tf.float32)], reference])
    np.testing.assert_allclose(losses, ref_losses, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(probs, ref_probs, rtol=tolerance, atol=1e-6)
    assert losses[3] > 80  # -log(1e-37) = 85.2 less the smoothing term


def test_smoothed_cross_entropy_rejects_a_label_outside_the_vocabulary(ops):
    with tf.Graph().as_default(), tf1.Session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
            sess.run(ops.smoothed_cross_entropy(tf.zeros([2, 5]), [1, 5], [0.0, 0.0], epsilon=0.1))


@pytest.mark.parametrize("shape,rate", [((3, 5, 16), 0.1), ((2, 7, 33), 0.3), ((1, 1, 8), 0.5)])
def test_embedding_dropout_matches_tensorflow_ops(ops, shape, rate):
    rng = np.random.RandomState(3)
    embedded, encodings = rng.randn(*shape).astype(np.float32), rng.randn(*shape[1:]).astype(np.float32)
    upstream = rng.randn(*shape).astype(np.float32)
    keep = kernels.keep_decisions((8, 9), shape, rate)
    with tf.Graph().as_default(), tf1.Session() as sess:
        e = tf.constant(embedded)
        fused = ops.embedding_dropout(e, encodings, tf.constant([8, 9]), scale=4.0, rate=rate)
        reference = tf.where(keep, (e * 4.0 + encodings) / (1 - rate), 0.0)
        values = sess.run([fused, reference] + tf.gradients(fused, e, upstream) + tf.gradients(reference, e, upstream))
    for a, b in (values[:2], values[2:]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert ((values[0] == 0) == ~keep).all()


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_accumulate_equals_the_cast_and_the_add_and_leaves_a_shared_total_alone(ops, dtype):
    rng = np.random.RandomState(5)
    total, addend = rng.randn(1001, 7).astype(np.float32), rng.randn(1001, 7).astype(np.float32)
    with tf.Graph().as_default(), tf1.Session() as sess:
        shared = tf.constant(total) * 1.0  # also read by the reference below, so it must not be overwritten
        x = tf.cast(tf.constant(addend), dtype)
        fused, reference = ops.accumulate(shared, x), shared + tf.cast(x, tf.float32)
        fused_value, reference_value, shared_value = sess.run([fused, reference, shared])
    np.testing.assert_array_equal(fused_value, reference_value)  # one float32 add of the widened value: exact
    np.testing.assert_array_equal(shared_value, total)


@pytest.mark.parametrize("dtype,index_dtype", [(tf.float32, tf.int32), (tf.bfloat16, tf.int64),
                                                (tf.float16, tf.int32)])
def test_scatter_add_rows_adds_repeated_rows_and_leaves_a_shared_total_alone(ops, dtype, index_dtype):
    rng = np.random.RandomState(6)
    total, rows = rng.randn(50, 37).astype(np.float32), rng.randn(300, 37).astype(np.float32)
    ids = rng.randint(0, 50, size=300)
    ids[:3] = [49, 0, 49]
    with tf.Graph().as_default(), tf1.Session() as sess:
        shared = tf.constant(total) * 1.0  # also fetched below, so it must not be overwritten
        values = tf.cast(tf.constant(rows), dtype)
        fused = ops.scatter_add_rows(shared, tf.constant(ids, index_dtype), values, scale=-0.9)
        fused_value, shared_value, widened = sess.run([fused, shared, tf.cast(values, tf.float32)])
    expected = total.copy()
    np.add.at(expected, ids, np.float32(-0.9) * widened)
    np.testing.assert_allclose(fused_value, expected, rtol=0, atol=2e-5)  # the same adds in another order
    np.testing.assert_array_equal(shared_value, total)


def test_scatter_add_rows_rejects_an_index_outside_the_total(ops):
    with tf.Graph().as_default(), tf1.Session() as sess:
        bad = ops.scatter_add_rows(tf.zeros([4, 3]), tf.constant([1, 4]), tf.ones([2, 3]))
        with pytest.raises(tf.errors.InvalidArgumentError, match="index 4 is outside the total's 4 rows"):
            sess.run(bad)


def reference_split(x, num_heads, parts):
    """modules.fused_heads's split with TensorFlow's ops: (N, T, P*d) -> P x (N*h, T, d/h)."""
    n, length, width = x.shape
    heads = tf.transpose(tf.reshape(x, [n, length, parts, num_heads, width // (parts * num_heads)]), [2, 0, 3, 1, 4])
    return tf.unstack(tf.reshape(heads, [parts, n * num_heads, length, -1]))


@pytest.mark.parametrize("dtype,parts,d_head", [(tf.float32, 1, 32), (tf.bfloat16, 3, 32), (tf.float16, 2, 5),
                                                (tf.float32, 3, 64)])
def test_split_and_merge_heads_move_what_the_transposes_move_and_are_each_others_gradient(ops, dtype, parts,
                                                                                          d_head):
    rng = np.random.RandomState(7)
    n, length, num_heads = 3, 11, 4
    x = rng.randn(n, length, parts * num_heads * d_head).astype(np.float32)
    ups = [rng.randn(n * num_heads, length, d_head).astype(np.float32) for _ in range(parts)]
    with tf.Graph().as_default(), tf1.Session() as sess:
        x_t, ups_t = tf.cast(tf.constant(x), dtype), [tf.cast(tf.constant(u), dtype) for u in ups]
        fused, reference = kernels.split_heads(x_t, num_heads, parts), reference_split(x_t, num_heads, parts)
        gradients = [tf.gradients(heads, x_t, ups_t)[0] for heads in (fused, reference)]
        merged = kernels.merge_heads(ups_t, num_heads)
        merged_gradients = tf.gradients(merged, ups_t, tf.cast(tf.constant(x), dtype))
        fused_v, reference_v, (grad_v, reference_grad_v), merged_v, merged_grads_v = sess.run(
            [fused, reference, gradients, merged, merged_gradients])
    for a, b in zip(fused_v, reference_v):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(grad_v, reference_grad_v)  # merge_heads is the split's gradient: the same copy
    np.testing.assert_array_equal(merged_v, reference_grad_v)
    for a, b in zip(merged_grads_v, reference_v):  # and split_heads merge's
        np.testing.assert_array_equal(a, b)


def test_split_heads_rejects_a_width_the_heads_do_not_divide(ops):
    with tf.Graph().as_default(), tf1.Session() as sess:
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="divisible|num_heads"):
            sess.run(ops.split_heads(tf1.placeholder_with_default(tf.zeros([2, 3, 10]), [None, None, None]),
                                     num_heads=4, parts=1))


def adam_updates(optimizer_class, shapes, steps=5):
    """The variables (sorted by name) and their values after `steps` updates of `optimizer_class` on fixed random
    variables and gradients, on the learning-rate and beta values of toolkit.training.step.make_optimizer."""
    rng = np.random.RandomState(11)
    initial = [rng.randn(*shape).astype(np.float32) for shape in shapes]
    grads = [[rng.randn(*shape).astype(np.float32) for shape in shapes] for _ in range(steps)]
    with tf.Graph().as_default(), tf1.Session() as sess:
        variables = [tf1.get_variable("w%d" % i, initializer=value) for i, value in enumerate(initial)]
        feeds = [tf1.placeholder(tf.float32, shape) for shape in shapes]
        train = optimizer_class(1e-3, beta1=0.9, beta2=0.98, epsilon=1e-9).apply_gradients(zip(feeds, variables))
        sess.run(tf1.global_variables_initializer())
        for step_grads in grads:
            sess.run(train, dict(zip(feeds, step_grads)))
        everything = sorted(tf1.global_variables(), key=lambda v: v.op.name)
        return [v.op.name for v in everything], sess.run(everything)


def test_one_pass_adam_is_adam_bit_for_bit_with_the_same_variables(ops):
    """Weights, both moments and the beta accumulators after five updates equal AdamOptimizer's exactly (sizes
    that no vector width divides among them), under the same names: checkpoints are unchanged."""
    shapes = [(7,), (33, 17), (256, 130), (1,)]
    names, values = adam_updates(kernels.OnePassAdam, shapes)
    reference_names, reference_values = adam_updates(tf1.train.AdamOptimizer, shapes)
    assert names == reference_names and len(names) == 3 * len(shapes) + 2  # weights, m and v; the two powers
    for name, got, want in zip(names, values, reference_values):
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert np.abs(values[names.index("w2/Adam")]).min() > 0  # the first moment: the updates ran


def test_keep_decisions_follow_the_rate_and_the_seed():
    keep = kernels.keep_decisions((5, 6), (601, 333), 0.1)
    assert abs(1 - keep.mean() - 0.1) < 0.004  # 4 standard deviations of a binomial over 200,133 entries
    assert (keep != kernels.keep_decisions((5, 7), (601, 333), 0.1)).mean() > 0.1
    assert kernels.keep_decisions((5, 6), (10,), 0.0).all()


def test_gradients_are_the_same_on_every_run_and_thread_count(ops):
    """The gradients of the gain, the bias and f's bias sum rows in fixed blocks, so threads do not change them."""
    rng = np.random.RandomState(0)
    x, f = rng.randn(300, 64).astype(np.float32), rng.randn(300, 64).astype(np.float32)
    values = []
    for threads in (1, 2, 2):
        with tf.Graph().as_default(), tf1.Session(config=tf1.ConfigProto(intra_op_parallelism_threads=threads)) as s:
            fb, g, b = tf.zeros([64]), tf.ones([64]), tf.zeros([64])
            y, _, _ = ops.residual_dropout_ln(x, f, fb, g, b, tf.constant([3, 4]), rate=0.1, epsilon=1e-6)
            values.append(s.run(tf.gradients(y, [fb, g, b], tf.constant(x))))
    for other in values[1:]:
        for a, b in zip(values[0], other):
            np.testing.assert_array_equal(a, b)


def test_unavailable_compiler_is_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "compile_command", lambda output: ["no-such-compiler-here", output])
    with pytest.raises(kernels.KernelsUnavailable, match="could not run g"):
        kernels.build("/nonexistent/never-written.so")
    assert kernels.choose_kernels("tf", has_gpu=False) == ("tf", None)
    kind, note = kernels.choose_kernels("auto", has_gpu=True)
    assert kind == "tf" and "GPU" in note


def predefined_macros(flags):
    """The macros g++ predefines for these target flags (the instruction sets it may use)."""
    result = subprocess.run(["g++", "-E", "-dM", "-x", "c++", "/dev/null"] + flags, capture_output=True, text=True,
                            check=True)
    return {line.split()[1] for line in result.stdout.splitlines()}


def require_gxx():
    """g++ for a compile-only test: under CI (which installs it) its absence fails, elsewhere the test skips."""
    if shutil.which("g++") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("g++ is missing under CI: scripts/test.sh installs it")
        pytest.skip("needs g++, which this machine lacks")


#: What each class of extensions defines: a cap must leave out every one above it.
AMX = {"__AMX_TILE__", "__AMX_INT8__", "__AMX_BF16__"}
BF16 = {"__AVX512BF16__"}
FP16 = {"__AVX512FP16__"}
#: (ONEDNN_MAX_CPU_ISA, macros that must not be defined for a Sapphire Rapids under it, macros that must be).
CAPS = [(None, FP16, AMX | BF16), ("ALL", FP16, AMX | BF16), ("AVX512_CORE_AMX", FP16, AMX | BF16),
        ("AVX512_CORE_FP16", FP16 | AMX, BF16), ("AVX512_CORE_BF16", FP16 | AMX, BF16),
        ("avx512_core", FP16 | AMX | BF16, {"__AVX512F__"}), ("AVX512_CORE_VNNI", FP16 | AMX | BF16, {"__AVX512F__"}),
        ("AVX2_VNNI", FP16 | AMX | BF16 | {"__AVX512F__"}, {"__AVX2__", "__AVXVNNI__"}),
        ("AVX2", FP16 | AMX | BF16 | {"__AVX512F__", "__AVXVNNI__"}, {"__AVX2__", "__FMA__"}),
        ("AVX", FP16 | AMX | BF16 | {"__AVX512F__", "__AVX2__", "__FMA__"}, {"__AVX__"}),
        ("SSE41", FP16 | AMX | BF16 | {"__AVX512F__", "__AVX2__", "__AVX__", "__FMA__"}, {"__SSE4_1__"})]


@pytest.mark.parametrize("cap,absent,present", CAPS, ids=[str(cap) for cap, _, _ in CAPS])
def test_each_onednn_cap_leaves_out_the_instruction_sets_above_it(cap, absent, present):
    """On the CPU with the most extensions (a Sapphire Rapids: AMX, AVX512-FP16, BF16), whatever this machine is:
    the build's target under each cap defines none of the extensions above it and keeps those below."""
    require_gxx()
    macros = predefined_macros(kernels.target_flags(cap, march="sapphirerapids"))
    assert not absent & macros and present <= macros, (sorted(absent & macros), sorted(present - macros))


def test_an_uncapped_build_is_for_this_cpu():
    require_gxx()
    flags = kernels.target_flags(None)
    assert flags[0] == "-march=native" and predefined_macros(flags) == predefined_macros(
        ["-march=native", "-mno-avx512fp16"])


@pytest.mark.slow
@pytest.mark.parametrize("march", list(kernels.targets()) if shutil.which("g++") else list(kernels.TARGETS))
def test_the_kernels_compile_for_every_x86_class(march):
    """The kernels' translation unit compiles (syntax and templates; nothing runs) for each x86 class, so a CPU
    this machine is not still gets the fused kernels."""
    require_gxx()
    ok, error = kernels.check_target(march)
    assert ok, "-march=%s (%s): %s" % (march, kernels.targets()[march], error)


def failing_compiler(tmp_path):
    """A compiler that writes an error like g++'s and exits 1, counting its runs in tmp_path/runs."""
    script = tmp_path / "failing-g++"
    script.write_text("#!/bin/sh\necho x >> %s\necho 'kernels.cc:1:1: error: simulated failure' >&2\nexit 1\n"
                      % (tmp_path / "runs"))
    script.chmod(0o755)
    return str(script)


def test_a_failed_build_is_tried_once_and_then_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("CXX", failing_compiler(tmp_path))
    notes = []
    for _ in range(2):  # two processes, as far as the build knows: each starts with load() not yet called
        kernels.load.cache_clear()
        start = time.monotonic()
        notes.append(kernels.choose_kernels("auto", has_gpu=False))
        seconds = time.monotonic() - start
    kernels.load.cache_clear()
    assert (tmp_path / "runs").read_text() == "x\n"  # the compiler ran once
    assert seconds < 2 and notes[0] == notes[1]
    failed = kernels.failure_path(kernels.library_path())
    assert notes[0] == ("tf", "kernels auto: TensorFlow's ops (the fused CPU kernels are unavailable: %s failed: "
                              "kernels.cc:1:1: error: simulated failure (remembered: delete %s to try the build "
                              "again))" % (os.environ["CXX"], failed))
    os.remove(failed)  # as the line says: the next load builds again
    with pytest.raises(kernels.KernelsUnavailable):
        kernels.load()
    kernels.load.cache_clear()
    assert (tmp_path / "runs").read_text() == "x\nx\n"


def test_a_capped_build_is_kept_beside_the_uncapped_one(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "compile_command", lambda output: ["true"])
    for name in ("kernels-00aa.so", "kernels-avx2-00bb.so"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert os.path.basename(kernels.library_path()).startswith("kernels-avx2-")
    kernels.build(str(tmp_path / "kernels-avx2-00cc.so"))  # replaces the older AVX2 build only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels-00aa.so", "kernels-avx2-00cc.so"]
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # no change of target: the plain build
    assert os.path.basename(kernels.library_path()).startswith("kernels-") and kernels.library_stem() == "kernels"
