"""Decoding speed: uncached greedy, cached greedy and cached beam 4 on the same model, sentences and machine.

    python scripts/bench_decode.py [--data_dir data/multi30k] [--sentences 500] [--batch_size 100]
                                   [--logdir LOGDIR] [--max_steps 50] [--threads 0]

Without --logdir the model has the fixed size d_model 256, 3+3 blocks, d_ff 1024, 8 heads and the data dir's
vocabulary (8000 for Multi30k), with random weights. Random weights almost never emit </s>, so every sentence is
decoded for exactly --max_steps steps (max_len_a 0, max_len_b = --max_steps): all three decoders do the same
number of steps. With --logdir the trained model and its --max_len_a/--max_len_b are used instead, and decoding
stops at </s>.

The first --sentences source lines of the eval (dev) split are sorted by length and cut into batches of
--batch_size sentences. Each decoder runs once on the first batch untimed (TensorFlow optimizes the graph on the
first run), then over every batch, timed, the three taking turns batch by batch (a change in the machine's load
hits all three alike). Reports sentences/s and target tokens/s (</s> included) per decoder,
their ratios, graph_build_s (building the cached greedy graph: model, encoder, decoding loop), first_run_s
(its first session.run on one batch) and peak_rss_mb. The last line is one JSON object.
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import runtime  # noqa: E402,F401  (first: TensorFlow's environment defaults)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from data_load import encode, load_data, load_vocab, pad  # noqa: E402
from hparams import Hparams  # noqa: E402
from model import Transformer  # noqa: E402
from errors import run_cli  # noqa: E402
from utils import (check_vocab, find_checkpoint, load_manifest, load_trained_hparams, resolve_precision,  # noqa: E402
                   restore, session_config, split_paths)

tf1 = tf.compat.v1

#: The model size of the benchmark, used without --logdir.
BENCH_MODEL = ["--d_model", "256", "--d_ff", "1024", "--num_blocks", "3", "--num_heads", "8", "--dropout_rate", "0"]


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
    return parser.parse_args(argv)


def model_hparams(args):
    """The model's hyperparameters: from --logdir, or the benchmark size with the data dir's vocabulary."""
    if args.logdir:
        hp = load_trained_hparams(args.logdir, {"data_dir": args.data_dir, "threads": args.threads})
        resolve_precision(hp)
        check_vocab(hp, load_manifest(hp.data_dir), hp.trained_data_dir)
        return hp
    hp = Hparams().parser.parse_args(BENCH_MODEL + ["--data_dir", args.data_dir, "--threads", str(args.threads),
                                                    "--max_len_a", "0", "--max_len_b", str(args.max_steps)])
    hp.vocab_size = load_manifest(args.data_dir)["vocab_size"]
    resolve_precision(hp)
    return hp


def load_batches(data_dir, num_sentences, batch_size):
    """The first num_sentences eval sources as ids + </s>, sorted by length, in batches.

    Returns a list of (x (N, T1) int32 padded with 0, x_seqlen (N,))."""
    manifest = load_manifest(data_dir)
    files = split_paths(data_dir, manifest, "eval")
    sents1, _, _ = load_data(files["bpe1"], files["bpe2"])
    token2idx, _ = load_vocab(os.path.join(data_dir, manifest["bpe_vocab"]))
    sources = sorted((encode(s, "x", token2idx) for s in sents1[:num_sentences]), key=len)
    return [pad(sources[i:i + batch_size]) for i in range(0, len(sources), batch_size)]


def time_decoders(sess, ops, feed_of, batches):
    """Runs every decoder in ops ({name: ids (N, T)}) once on the first batch untimed, then over every batch, timed,
    the decoders taking turns batch by batch so that a change in the machine's load hits them alike.

    Returns {name: (seconds, target tokens, list of ids per batch)}."""
    for ids_op in ops.values():
        sess.run(ids_op, feed_of(batches[0]))
    seconds, outputs = dict.fromkeys(ops, 0.0), {name: [] for name in ops}
    for batch in batches:
        for name, ids_op in ops.items():
            start = time.perf_counter()
            outputs[name].append(sess.run(ids_op, feed_of(batch)))
            seconds[name] += time.perf_counter() - start
    return {name: (seconds[name], int(sum((ids != 0).sum() for ids in outputs[name])), outputs[name])
            for name in ops}


def same_outputs(a, b):
    """Whether two lists of (N, T) id batches are equal, ignoring extra padding columns."""
    def trimmed(ids):
        return ids[:, :max(1, int((ids != 0).sum(1).max()))]
    return all(np.array_equal(trimmed(x), trimmed(y)) for x, y in zip(a, b))


def main(argv=None):
    args = parse_args(argv)
    tf1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    hp = model_hparams(args)
    batches = load_batches(hp.data_dir, args.sentences, args.batch_size)
    x, x_seqlen = tf1.placeholder(tf.int32, [None, None]), tf1.placeholder(tf.int32, [None])
    xs = (x, x_seqlen, tf.zeros_like(x_seqlen, tf.string))
    decoding = (hp.alpha, hp.max_len_a, hp.max_len_b)

    start = time.perf_counter()
    tf1.set_random_seed(hp.seed)
    model = Transformer(hp)
    cached_ids, _ = model.translate(xs, 1, *decoding)
    graph_build_s = time.perf_counter() - start
    uncached_ids, _ = model.translate(xs, 1, *decoding, cached=False)
    beam_ids, _ = model.translate(xs, 4, *decoding)

    def feed_of(batch):
        return {x: batch[0], x_seqlen: batch[1]}
    with tf1.Session(config=session_config(hp)) as sess:
        if args.logdir:
            restore(sess, find_checkpoint(hp.logdir, hp.ckpt), hp.logdir)
        else:
            sess.run(tf1.global_variables_initializer())
        start = time.perf_counter()
        sess.run(cached_ids, feed_of(batches[0]))
        first_run_s = time.perf_counter() - start
        runs = time_decoders(sess, {"uncached_greedy": uncached_ids, "cached_greedy": cached_ids, "beam4": beam_ids},
                             feed_of, batches)
    sentences, result = sum(len(b[0]) for b in batches), {}
    for name, (seconds, tokens, _) in runs.items():
        print("%-16s %7.2f s  %8.1f sentences/s  %9.1f target tokens/s"
              % (name, seconds, sentences / seconds, tokens / seconds))
        result.update({name + "_sents_per_s": round(sentences / seconds, 2),
                       name + "_tokens_per_s": round(tokens / seconds, 1), name + "_s": round(seconds, 2),
                       name + "_mean_target_len": round(tokens / sentences, 2)})
    result.update({
        "cached_vs_uncached_speedup": round(runs["uncached_greedy"][0] / runs["cached_greedy"][0], 2),
        "beam4_vs_uncached_speedup": round(runs["uncached_greedy"][0] / runs["beam4"][0], 2),
        "cached_equals_uncached": same_outputs(runs["cached_greedy"][2], runs["uncached_greedy"][2]),
        "graph_build_s": round(graph_build_s, 3), "first_run_s": round(first_run_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sentences": sentences, "batch_size": args.batch_size,
        "weights": args.logdir or "random", "max_steps": None if args.logdir else args.max_steps,
        "d_model": hp.d_model, "d_ff": hp.d_ff, "num_blocks": hp.num_blocks, "num_heads": hp.num_heads,
        "vocab_size": hp.vocab_size, "threads": args.threads or os.cpu_count(),
    })
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_cli(main)
