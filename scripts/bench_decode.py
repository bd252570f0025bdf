"""Decoding speed of our in-graph decoders and of CTranslate2 on the same weights, sentences and machine.

    python scripts/bench_decode.py [--data_dir data/multi30k] [--sentences 500] [--batch_size 100]
                                   [--logdir LOGDIR] [--max_steps 50] [--threads 0] [--no_reference]
                                   [--ensemble] [--profile K]

Without --logdir the model has the fixed size d_model 256, 3+3 blocks, d_ff 1024, 8 heads and the data dir's
vocabulary (8000 for Multi30k), with random weights. Random weights almost never emit </s>, so every sentence is
decoded for exactly --max_steps steps (max_len_a 0, max_len_b = --max_steps; CTranslate2 with min and max
decoding length --max_steps): every decoder runs the decoder --max_steps times per sentence. With --logdir the
trained model and its --max_len_a/--max_len_b are used instead, and decoding stops at </s> (CTranslate2 takes one
length limit per batch: the longest of its sentences').

Decoders: the reference path's greedy (model.Transformer in float32, its cache appended to by concatenation; left
out with --no_reference), the model's cached greedy (--impl fast: FastTransformer's), cached beam 4, and, when the
ctranslate2 package is installed, CTranslate2 greedy and beam 4 with the same weights converted
(ctranslate2_engine.py) and run with float32 and with int8 weights, on as many threads. With --ensemble,
greedy and beam 4 of an ensemble (decoding.Ensemble) of the model and a second random one of its size, and the
ratio of their time to one model's.

The first --sentences source lines of the eval (dev) split are sorted by length and cut into batches of
--batch_size sentences. Each decoder runs once on the first batch untimed (TensorFlow optimizes the graph on the
first run), then over every batch, timed, the decoders taking turns batch by batch (a change in the machine's load
hits all alike). Reports sentences/s and target tokens/s (</s> included) per decoder, the ratios of ours to
CTranslate2 float32, the share of sentences on which CTranslate2 float32 greedy gives our cached greedy's output
(with random weights: its first --max_steps - 1 tokens), graph_build_s (building the cached greedy graph: model,
encoder, decoding loop), first_run_s (its first session.run on one batch), peak_rss_mb, the CPU and its ISA flags,
and a 2048x2048 fp32 matmul's GFLOP/s measured in the same run. With --profile K it traces K runs of cached greedy
and of beam 4 on the first batch and adds the time per op type, in ms per run. The last line is one JSON object.
"""
import argparse
import collections
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toolkit.base import runtime  # noqa: E402  (first: TensorFlow's environment defaults)
from toolkit.base import machine

import tensorflow as tf  # noqa: E402

from toolkit.translating import ctranslate2_engine  # noqa: E402
from bench_train import matmul_gflops, op_type  # noqa: E402
from data_load import EOS_ID, Sources, load_side, pad  # noqa: E402
from toolkit.data.datadir import bpe_model_path, load_manifest  # noqa: E402
from decoding import DecodingSettings, Ensemble, translate  # noqa: E402
from hparams import Hparams, resolved  # noqa: E402
from toolkit.translating.trained_model import TrainedModel, trained_hparams  # noqa: E402
from model import ModelConfig, Transformer  # noqa: E402
from fast import build_transformer  # noqa: E402
from toolkit.base.cli import run_cli  # noqa: E402

tf1 = tf.compat.v1

#: The model size of the benchmark, used without --logdir.
BENCH_MODEL = ["--d_model", "256", "--d_ff", "1024", "--num_blocks", "3", "--num_heads", "8", "--dropout_rate", "0"]
#: Beam width of the beam-search decoders.
BEAM = 4


def parse_args(argv):
    """The benchmark's flags (argv: list of strings, or None for sys.argv)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default="data/multi30k", help="data dir whose eval split is decoded")
    parser.add_argument("--logdir", default="", help="decode with this trained model instead of random weights")
    parser.add_argument("--sentences", type=int, default=500, help="how many eval sentences to decode")
    parser.add_argument("--batch_size", type=int, default=100, help="sentences per batch (sorted by length)")
    parser.add_argument("--max_steps", type=int, default=50,
                        help="decoding steps per sentence with random weights (ignored with --logdir)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads; 0 uses every core")
    parser.add_argument("--no_reference", action="store_true",
                        help="leave out the reference path's (slower) greedy decoder")
    parser.add_argument("--ensemble", action="store_true",
                        help="also decode with an ensemble of the model and a second one of its size "
                             "(random weights; not with --logdir), greedy and beam 4")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="trace K runs of cached greedy and of beam 4 on the first batch: time per op type "
                             "and per part of the decoding step")
    args = parser.parse_args(argv)
    if args.ensemble and args.logdir:
        parser.error("--ensemble measures random weights: leave out --logdir")
    return args


def model_hparams(args):
    """The model's hyperparameters, and the trained model of --logdir (None without it: the benchmark's size, the
    data dir's vocabulary and random weights)."""
    if args.logdir:
        hp = trained_hparams(args.logdir, {"data_dir": args.data_dir, "threads": args.threads})
        return hp, TrainedModel(hp, hp.ckpt)
    hp = Hparams().parser.parse_args(BENCH_MODEL + ["--data_dir", args.data_dir, "--threads", str(args.threads),
                                                    "--max_len_a", "0", "--max_len_b", str(args.max_steps)])
    return resolved(hp, vocab_size=load_manifest(args.data_dir)["vocab_size"],
                    precision=machine.resolved_precision(hp.impl, hp.precision)), None


def load_batches(data_dir, num_sentences, batch_size):
    """The first num_sentences eval sources as ids + </s>, sorted by length, in batches.

    Returns a list of lists of id lists."""
    ids, offsets = load_side(data_dir, load_manifest(data_dir), "eval", 1)
    sources = sorted((ids[start:end].tolist() + [EOS_ID] for start, end in zip(offsets[:num_sentences],
                                                                              offsets[1:num_sentences + 1])), key=len)
    return [[list(ids) for ids in sources[i:i + batch_size]] for i in range(0, len(sources), batch_size)]


def tensorflow_decoder(sess, ids_op, x, x_seqlen):
    """A decoder over a session: batch (list of id lists) -> list of translations (id lists, </s> included)."""
    def decode(batch):
        padded, seqlen = pad(batch)
        return [[int(i) for i in row if i != 0] for row in sess.run(ids_op, {x: padded, x_seqlen: seqlen})]
    return decode


def ctranslate2_decoders(sess, hp, bpe_model, model_dir, args):
    """CTranslate2 greedy and beam decoders, float32 and int8, on the session's weights converted into model_dir.

    Returns {name: decoder} like tensorflow_decoder, or {} when the ctranslate2 package is missing."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("ctranslate2 is not installed: CTranslate2 is left out", file=sys.stderr)
        return {}
    weights = {v.op.name: value for v, value in zip(tf1.global_variables(), sess.run(tf1.global_variables()))}
    ctranslate2_engine.write_model(weights, hp, bpe_model, model_dir)
    forced = None if args.logdir else args.max_steps + 1  # engine.decode counts the step that may only give </s>
    decoders = {}
    for compute_type, name in (("float32", "fp32"), ("int8", "int8")):
        engine = ctranslate2_engine.CTranslate2Translator(model_dir, DecodingSettings.from_flags(hp), hp.test_batch_size,
                                               compute_type=compute_type,
                                               threads=args.threads or os.cpu_count())
        for beam in (1, BEAM):
            def decode(batch, engine=engine, beam=beam):
                results = engine.decode(batch, forced, forced or 1, beam, return_end_token=True)
                return [[engine.sp.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
            decoders["ct2_%s_%s" % (name, "greedy" if beam == 1 else "beam%d" % beam)] = decode
    return decoders


def time_decoders(decoders, batches):
    """Runs every decoder once on the first batch untimed, then over every batch, timed, the decoders taking turns
    batch by batch so that a change in the machine's load hits them alike.

    Returns {name: (seconds, target tokens, list of translations)}."""
    for decode in decoders.values():
        decode(batches[0])
    seconds, outputs = dict.fromkeys(decoders, 0.0), {name: [] for name in decoders}
    for batch in batches:
        for name, decode in decoders.items():
            start = time.perf_counter()
            outputs[name] += decode(batch)
            seconds[name] += time.perf_counter() - start
    return {name: (seconds[name], sum(map(len, outputs[name])), outputs[name]) for name in decoders}


def agreement(a, b, length=None):
    """The share of translations (id lists) equal in a and b, or equal in their first `length` ids."""
    return sum(x[:length] == y[:length] for x, y in zip(a, b)) / len(a)


def step_part(node_name, op):
    """The part of the decoding loop a traced node belongs to, by its name scope and op type."""
    for part in ("output_projection", "search", "beam_reorder", "self_attention", "vanilla_attention",
                 "positionwise_feedforward", "cache_write"):
        if "/%s/" % part in "/" + node_name + "/":
            return part
    if op in ("Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "While", "StatelessWhile"):
        return "while_loop_control"
    return "other"


def profile_decoder(sess, ids_op, feed, runs):
    """Traces runs session runs of ids_op. Returns ({part: ms per run}, {op type: ms per run}, wall ms per run);
    ops that run at the same time on two threads both count, so the sums can exceed the wall time."""
    parts, ops, wall = collections.Counter(), collections.Counter(), 0.0
    for _ in range(runs):
        metadata = tf1.RunMetadata()
        start = time.perf_counter()
        sess.run(ids_op, feed, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
        wall += (time.perf_counter() - start) * 1000 / runs
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                ms = node.all_end_rel_micros / 1000 / runs
                op = op_type(node)
                ops[op] += ms
                parts[step_part(node.node_name, op)] += ms
    def rounded(counter):
        return {key: round(ms, 1) for key, ms in counter.most_common()}
    return rounded(parts), dict(list(rounded(ops).items())[:15]), round(wall, 1)


def main(argv=None):
    args = parse_args(argv)
    runtime.start_graph_mode()
    hp, trained = model_hparams(args)
    config = machine.session_config(hp)
    matmul = matmul_gflops(config)
    batches = load_batches(hp.data_dir, args.sentences, args.batch_size)
    x, x_seqlen = tf1.placeholder(tf.int32, [None, None]), tf1.placeholder(tf.int32, [None])
    xs = Sources(x, x_seqlen)
    greedy = dataclasses.replace(DecodingSettings.from_flags(hp), beam_size=1)

    start = time.perf_counter()
    tf1.set_random_seed(hp.seed)
    model = build_transformer(ModelConfig.from_flags(hp))
    cached_ids, _ = translate(model, xs, greedy)
    graph_build_s = time.perf_counter() - start
    ops = {"cached_greedy": cached_ids, "beam4": translate(model, xs, dataclasses.replace(greedy, beam_size=BEAM))[0]}
    if args.ensemble:  # a second model of the same size, in a scope of its own
        with tf1.variable_scope("ensemble_1"):
            second = build_transformer(ModelConfig.from_flags(hp))
        ensemble = Ensemble([model, second], [None, "ensemble_1"])
        ops["ensemble2_greedy"] = translate(ensemble, xs, greedy)[0]
        ops["ensemble2_beam4"] = translate(ensemble, xs, dataclasses.replace(greedy, beam_size=BEAM))[0]
    if not args.no_reference:
        reference = Transformer(dataclasses.replace(ModelConfig.from_flags(hp), impl="reference", precision="fp32"))
        ops["reference_greedy"] = translate(reference, xs, greedy)[0]
    bpe_model = bpe_model_path(hp.data_dir, load_manifest(hp.data_dir))
    with trained.session() if trained else tf1.Session(config=config) as sess, \
            tempfile.TemporaryDirectory() as tmp:
        if not trained:
            sess.run(tf1.global_variables_initializer())
        decoders = {name: tensorflow_decoder(sess, op, x, x_seqlen) for name, op in ops.items()}
        start = time.perf_counter()
        decoders["cached_greedy"](batches[0])
        first_run_s = time.perf_counter() - start
        decoders.update(ctranslate2_decoders(sess, hp, bpe_model, os.path.join(tmp, "ct2"), args))
        runs = time_decoders(decoders, batches)
        profiles = {}
        if args.profile:
            padded, seqlen = pad(batches[0])
            for name in ("cached_greedy", "beam4"):
                profiles[name] = profile_decoder(sess, ops[name], {x: padded, x_seqlen: seqlen}, args.profile)
    sentences, result = sum(map(len, batches)), {}
    for name, (seconds, tokens, _) in runs.items():
        print("%-16s %7.2f s  %8.1f sentences/s  %9.1f target tokens/s"
              % (name, seconds, sentences / seconds, tokens / seconds))
        result.update({name + "_sents_per_s": round(sentences / seconds, 2),
                       name + "_tokens_per_s": round(tokens / seconds, 1), name + "_s": round(seconds, 2),
                       name + "_mean_target_len": round(tokens / sentences, 2)})
    speed = {name: sentences / seconds for name, (seconds, _, _) in runs.items()}
    if "ct2_fp32_greedy" in runs:
        result.update({
            "cached_greedy_vs_ct2_fp32": round(speed["cached_greedy"] / speed["ct2_fp32_greedy"], 3),
            "beam4_vs_ct2_fp32": round(speed["beam4"] / speed["ct2_fp32_beam4"], 3),
            "cached_greedy_vs_ct2_int8": round(speed["cached_greedy"] / speed["ct2_int8_greedy"], 3),
            "beam4_vs_ct2_int8": round(speed["beam4"] / speed["ct2_int8_beam4"], 3),
            # forced steps: our last step may only give </s>, CTranslate2's gives any token
            "ct2_fp32_greedy_agreement": round(agreement(runs["cached_greedy"][2], runs["ct2_fp32_greedy"][2],
                                                         None if args.logdir else args.max_steps - 1), 4),
        })
    if "ensemble2_greedy" in runs:  # time per sentence, relative to one model's
        result.update({"ensemble2_greedy_time_ratio": round(speed["cached_greedy"] / speed["ensemble2_greedy"], 3),
                       "ensemble2_beam4_time_ratio": round(speed["beam4"] / speed["ensemble2_beam4"], 3)})
    if "reference_greedy" in runs:
        result.update({
            "cached_vs_reference_speedup": round(speed["cached_greedy"] / speed["reference_greedy"], 2),
            "cached_equals_reference": runs["cached_greedy"][2] == runs["reference_greedy"][2],
        })
    for name, (parts, op_types, wall) in profiles.items():
        result["profile_" + name] = {"wall_ms_per_run": wall, "ms_per_part": parts, "ms_per_op_type": op_types}
    result.update({
        "graph_build_s": round(graph_build_s, 3), "first_run_s": round(first_run_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sentences": sentences, "batch_size": args.batch_size,
        "weights": args.logdir or "random", "max_steps": None if args.logdir else args.max_steps,
        "d_model": hp.d_model, "d_ff": hp.d_ff, "num_blocks": hp.num_blocks, "num_heads": hp.num_heads,
        "vocab_size": hp.vocab_size, "precision": hp.precision, "threads": args.threads or os.cpu_count(),
        "matmul_gflops_per_s": round(matmul, 1), **machine.machine_summary(),
    })
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_cli(main)
