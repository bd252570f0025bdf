"""How long train.py's iterator takes to switch between the training and the dev data, with the model in the graph.

    python scripts/bench_iterator.py --data_dir data/multi30k [--rounds 6] [model and batching flags of train.py]

Builds toolkit.training.graph.build_graph as train.py does, then repeats: initialize the training data (the round's epoch), run 3
training steps, initialize the dev data, decode 2 dev batches. The steps and batches are there so that each
initializer replaces an iterator in use, as between train.py's epochs and before its dev decodes; their own times
are not the point. The last line is one JSON object: the seconds of every initializer call, and the longest after
the first round (the first builds what every later one reuses).
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toolkit.base import runtime  # noqa: E402  (first: TensorFlow's environment defaults)
from toolkit.base import machine

import tensorflow as tf  # noqa: E402

from toolkit.training import distributed  # noqa: E402
import train  # noqa: E402
from toolkit.training.graph import build_graph  # noqa: E402

tf1 = tf.compat.v1


def timed(sess, op, feed=None):
    start = time.time()
    sess.run(op, feed)
    return time.time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="train/dev switches to time")
    args, argv = parser.parse_known_args(argv)  # the rest: train.py's flags
    runtime.start_graph_mode()
    with tempfile.TemporaryDirectory() as logdir:
        hp, manifest = train.resolve_hparams(argv + ["--logdir", logdir])
        cluster = distributed.make_cluster(hp, machine.session_config(hp))
        g = build_graph(hp, manifest, cluster)
        train_init, eval_init = [], []
        with tf1.Session(cluster.target, config=cluster.config) as sess:
            sess.run(g.init)
            for epoch in range(args.rounds):
                train_init.append(timed(sess, g.train_init, {g.epoch: epoch, g.skip: 0}))
                for _ in range(3):
                    sess.run(g.step.batch["update"])
                eval_init.append(timed(sess, g.eval_init))
                for _ in range(2):
                    sess.run(g.eval_ids)
                print("round %d: train_init %.2f s, eval_init %.2f s" % (epoch + 1, train_init[-1], eval_init[-1]),
                      flush=True)
    later = train_init[1:] + eval_init[1:]
    print(json.dumps(dict(train_init_s=[round(t, 3) for t in train_init], eval_init_s=[round(t, 3) for t in eval_init],
                          max_after_first_round_s=round(max(later), 3) if later else None)))


if __name__ == "__main__":
    main()
