"""Training throughput and memory, measured against a matmul on the same machine in the same run.

    python scripts/bench_train.py --data_dir data/multi30k [--steps 40] [model and batching flags of train.py]

Reports real (non-pad) source and target tokens/s (median over the timed steps, after warm-up; for the target
side also the mean, total tokens over total time, and the epoch's: its mean real target tokens per batch over the
median step time, which does not depend on which batches were timed), real tokens per sentence, the padding
fraction, step time (a batch's; under --accum_steps N with a 1/N share of applying the summed gradients), graph
build time, peak RSS, model FLOPs per step counted from the model's shapes (scripts/model_flops.py: forward and
backward, both passes of the rows under --rdrop, whose tokens count once), and their ratio to a 2048x2048 fp32
matmul's FLOP/s measured here (mfu); with bf16 or fp16 products also the same matmul in that dtype and the ratio to
it (mfu_bf16). The last line is one JSON object.

The JSON also names the machine: CPU model, its ISA flags (avx2, avx512f, avx512_bf16, amx_bf16), the
ONEDNN_MAX_CPU_ISA cap if set, and the ISA oneDNN reports using. With --profile K it traces K more steps and adds
the time per op type (RunMetadata step stats), in ms per step, largest first: the profile of docs/performance.md,
and its sums over the matrix products and over all other ops.

With --flags_from_stdin it measures one model per line of stdin (a JSON list of train.py flags added after those on
the command line, so that a flag in both, such as --data_dir, takes the line's value) as the lines come, each in a
tf.Graph and session of its own, TensorFlow imported once for all: a JSON line {"graph_build_s": seconds} when a
graph is built, then its result (or {"error": why}), its speeds without the matmul readings and mfu, which would
cost seconds before the first result; scripts/recipe.py measures its candidates so, each on its own data dir, and
stops it when its time is up. peak_rss_mb is then the process's peak so far.

Timed steps are steady-state steps: the first step on each new batch shape builds oneDNN kernels for it (a
one-time cost of the first epoch), so such steps are counted apart (new_shape_steps, new_shape_step_s) and
the run goes on until --steps steps on shapes already seen are timed.
"""
import argparse
import collections
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toolkit.base import runtime  # noqa: E402  (first: TensorFlow's environment defaults)
from toolkit.base import machine

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from toolkit.training import distributed  # noqa: E402
from toolkit.base.errors import UserError  # noqa: E402
from toolkit.base.cli import run_cli
from data_load import epoch_pairs, input_fn  # noqa: E402
from toolkit.data.datadir import load_manifest  # noqa: E402
from hparams import Hparams, resolved  # noqa: E402
from toolkit.training.step import build_step  # noqa: E402
from fast import resolved_kernels  # noqa: E402
from fast.model import COMPUTE_DTYPES  # noqa: E402
from model_flops import training_flops  # noqa: E402

tf1 = tf.compat.v1


def matmul_gflops(config, n=2048, repeats=10, dtype=tf.float32):
    """Median FLOP/s of an n x n matmul in dtype in a session with the given config, in GFLOP/s."""
    with tf.Graph().as_default():
        a = tf.cast(tf1.get_variable("a", [n, n], initializer=tf1.random_normal_initializer()), dtype)
        product = tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32))
        with tf1.Session(config=config) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(product)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                sess.run(product)
                times.append(time.perf_counter() - start)
    return 2.0 * n ** 3 / np.median(times) / 1e9


def op_type(node_stats):
    """The op type of a traced node ("MatMul", "_MklLayerNorm", ...) from its timeline label "name = Type(...)"."""
    label = node_stats.timeline_label
    return label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node_stats.node_name


def profile_ops(sess, fetches, steps):
    """Runs fetches steps times with full tracing. Returns {op type: ms per step}, largest first. Ops that run at
    the same time on different threads both count, so the sum can exceed the step's wall time."""
    totals = collections.Counter()
    for _ in range(steps):
        metadata = tf1.RunMetadata()
        sess.run(fetches, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                totals[op_type(node)] += node.all_end_rel_micros / 1000 / steps
    return {op: round(ms, 2) for op, ms in totals.most_common()}


def mfu_fields(hp, config, model_gflops, matmuls):
    """The 2048^2 fp32 matmul here and the model's share of it (mfu); with 16-bit matrix products also the same
    matmul in that dtype and the model's share of it (mfu_bf16). Each matmul is read once per process, kept in
    matmuls {dtype: GFLOP/s}."""
    dtypes = [(tf.float32, "")]
    if hp.precision != "fp32":
        dtypes.append((COMPUTE_DTYPES[hp.precision], "_" + hp.precision))
    fields = {}
    for dtype, suffix in dtypes:
        if dtype not in matmuls:
            matmuls[dtype] = matmul_gflops(config, dtype=dtype)
        fields["matmul%s_gflops_per_s" % suffix] = round(matmuls[dtype], 1)
        fields["mfu%s" % suffix] = round(model_gflops / matmuls[dtype], 3)
    return fields


def matmul_share(profile):
    """{op type: ms per step} -> the ms per step of the matrix products (op types with MatMul in their name, oneDNN's
    and fused ones included) and of everything else, the work the kernels of fast/kernels.py shrink."""
    matmul = sum(ms for op, ms in profile.items() if "MatMul" in op)
    return {"matmul_ms_per_step": round(matmul, 1), "other_ms_per_step": round(sum(profile.values()) - matmul, 1)}


def resolve_hparams(train_flags):
    """train.py's flags, resolved once as train.py does: the data dir's vocabulary size, the precision. Returns hp
    and the data dir's manifest."""
    hp = Hparams().parser.parse_args(train_flags)
    manifest = load_manifest(hp.data_dir)
    return resolved(hp, vocab_size=manifest["vocab_size"],
                    precision=machine.resolved_precision(hp.impl, hp.precision),
                    kernels=resolved_kernels(hp.impl, hp.kernels)), manifest


def measure(hp, manifest, args, matmuls=None, built=lambda seconds: None):
    """bench_train's result (a dict, the JSON it prints) for train.py's resolved flags hp: the graph built in a
    tf.Graph of its own and stepped in a session of its own. args: the benchmark's flags (--warmup, --steps,
    --max_steps, --profile); matmuls: the 2048^2 matmuls read in this process ({dtype: GFLOP/s}, read when first
    needed), which the result compares the model against (mfu_fields), or None for a result without them;
    built(seconds) is called once the graph is built."""
    config = machine.session_config(hp)
    start = time.time()
    with tf.Graph().as_default() as graph:
        tf1.set_random_seed(hp.seed)
        # train.py's batches (data_load.get_batch), with the pairs kept for the epoch's token count
        pairs_of = epoch_pairs(hp.data_dir, manifest, "train", hp.maxlen1, hp.maxlen2, hp.truncate, hp.bpe_dropout,
                               hp.seed)
        batches, num_batches = input_fn(pairs_of, hp.batch_size, shuffle=True, batch_type=hp.batch_type,
                                        seed=hp.seed, growth=hp.bucket_growth)
        if args.batches:  # the same few batches over and over: after their first pass every step is timed
            batches = batches.take(args.batches).cache()
        xs, ys = tf1.data.make_one_shot_iterator(batches.repeat()).get_next()
        step = build_step(hp, xs, ys, distributed.make_cluster(hp, config))
        train_op = step.batch["update"]
        shapes = [tf.shape(xs.x), tf.shape(ys.y), tf.reduce_sum(xs.x_seqlen), tf.reduce_sum(ys.y_seqlen)]
        # the local variables: --accum_steps's accumulators
        init = tf1.group(tf1.global_variables_initializer(), tf1.local_variables_initializer())
    graph_build_s = time.time() - start
    built(graph_build_s)
    with tf1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        seen, apply_seconds, batches = set(), [], 0
        for _ in range(args.warmup):
            _, (n, t1), (_, t2) = sess.run([train_op] + shapes[:2])
            seen.add((n, t1, t2))
            batches += 1
            apply_if_due(sess, step, batches, apply_seconds)
        steps, new_shape_seconds = [], []
        while len(steps) < args.steps and len(steps) + len(new_shape_seconds) < args.max_steps:
            t = time.perf_counter()
            _, (n, t1), (_, t2), real1, real2 = sess.run([train_op] + shapes)
            seconds = time.perf_counter() - t
            batches += 1
            apply_if_due(sess, step, batches, apply_seconds)
            if (n, t1, t2) in seen:
                steps.append((seconds, n, t1, t2, real1, real2))
            else:
                seen.add((n, t1, t2))
                new_shape_seconds.append(seconds)
        profile = profile_ops(sess, train_op, args.profile) if args.profile else None
    if not steps:
        raise UserError("no step of the %d after warm-up came on a batch shape seen before, so none was timed: "
                        "raise --max_steps" % len(new_shape_seconds))
    seconds, n, t1, t2, real1, real2 = (np.array(c, np.float64) for c in zip(*steps))
    if apply_seconds:  # each batch's share of applying the accumulated gradients
        seconds += np.median(apply_seconds) / hp.accum_steps
    flops = np.array([training_flops(hp, *s) for s in zip(n, t1, t2, real2)])
    step_s = float(np.median(seconds))
    epoch_tokens_per_step = int(pairs_of(0)[0].lengths2.sum()) / num_batches(0)  # every pair is in a batch
    model_gflops = float(np.median(flops / seconds) / 1e9)
    result = {
        "real_src_tokens_per_s": round(float(np.median(real1 / seconds)), 1),
        "real_tgt_tokens_per_s": round(float(np.median(real2 / seconds)), 1),
        "real_tgt_tokens_per_s_mean": round(float(real2.sum() / seconds.sum()), 1),  # over the timed steps
        "epoch_tgt_tokens_per_step": round(epoch_tokens_per_step, 1),
        "epoch_tgt_tokens_per_s": round(epoch_tokens_per_step / step_s, 1),
        "padding_fraction": round(float(1 - (real1.sum() + real2.sum()) / (n * t1 + n * t2).sum()), 4),
        "real_src_tokens_per_sentence": round(float(real1.sum() / n.sum()), 2),
        "real_tgt_tokens_per_sentence": round(float(real2.sum() / n.sum()), 2),
        "step_s": round(step_s, 4),
        "timed_steps": len(steps),
        "new_shape_steps": len(new_shape_seconds),
        "new_shape_step_s": round(float(np.median(new_shape_seconds)), 4) if new_shape_seconds else None,
        "sentences_per_batch": float(np.mean(n)),
        "graph_build_s": round(graph_build_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "model_gflops_per_step": round(float(np.median(flops)) / 1e9, 2),
        "model_gflops_per_s": round(model_gflops, 1),
        **(mfu_fields(hp, config, model_gflops, matmuls) if matmuls is not None else {}),
        "impl": hp.impl, "precision": hp.precision, "kernels": hp.kernels, "batch_type": hp.batch_type,
        "batch_size": hp.batch_size,
        "d_model": hp.d_model, "d_ff": hp.d_ff, "num_blocks": hp.num_blocks, "vocab_size": hp.vocab_size,
        **machine.machine_summary(), "onednn_isa": machine.onednn_isa(),
        "allocator_bfc": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"),
    }
    if profile:
        result.update(matmul_share(profile), profile_ms_per_step=profile)
    return result


def apply_if_due(sess, step, batches, apply_seconds):
    """Under --accum_steps N, after every N-th batch (batches: how many ran): applies the accumulated
    gradients (step.apply, as train.py does) and appends the seconds it took to apply_seconds."""
    if step.apply is not None and batches % step.accum_steps == 0:
        start = time.perf_counter()
        sess.run(step.apply, {step.write_summaries: False})
        apply_seconds.append(time.perf_counter() - start)


def print_json(value):
    print(json.dumps(value), flush=True)


def measure_each_from_stdin(common_flags, args):
    """--flags_from_stdin: for each line of stdin (a JSON list of train.py flags, added to common_flags) as it
    comes, one JSON line once its graph is built ({"graph_build_s": seconds}), then its result without the matmul
    readings (the speeds are what is wanted, at once), or {"error": why} when its measurement is refused or its
    graph fails to run (flags train.py refuses end the process, as without --flags_from_stdin). Ends at the end of stdin."""
    for line in iter(sys.stdin.readline, ""):
        try:
            hp, manifest = resolve_hparams(common_flags + json.loads(line))
            result = measure(hp, manifest, args, built=lambda s: print_json({"graph_build_s": round(s, 2)}))
        except UserError as error:
            result = {"error": str(error)}
        except tf.errors.OpError as error:  # one model's failure ends only its own measurement
            result = {"error": "%s: %s" % (type(error).__name__, error.message.strip().splitlines()[0])}
        print_json(result)


def main(argv=None):
    bench = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--steps", type=int, default=40, help="timed steps on batch shapes seen before")
    bench.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    bench.add_argument("--max_steps", type=int, default=400, help="stop after this many steps in all")
    bench.add_argument("--profile", type=int, default=0, help="trace this many steps after the timed ones")
    bench.add_argument("--batches", type=int, default=0,
                       help="step through only the first K batches of the shuffled data, over and over, so that "
                            "the steps after their first pass are all timed (a quick measurement: K shapes instead "
                            "of the whole length mix); 0: all of them")
    bench.add_argument("--flags_from_stdin", action="store_true",
                       help="measure one model per line of stdin (a JSON list of train.py flags, added after "
                            "those given here: a line's --data_dir is the one its model trains on), each in its own "
                            "graph, printing a JSON line when its graph is built and one with its result (speeds "
                            "only: no matmul is read, and there is no mfu); TensorFlow is imported once for all")
    args, rest = bench.parse_known_args(argv)
    hp, manifest = resolve_hparams(rest)
    runtime.start_graph_mode()
    if args.flags_from_stdin:
        measure_each_from_stdin(rest, args)
    else:
        print_json(measure(hp, manifest, args, matmuls={}))


if __name__ == "__main__":
    run_cli(main)
