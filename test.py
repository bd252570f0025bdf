"""Translates the whole test split with a trained model and reports sacreBLEU, or scores
other file pairs.

    python test.py --logdir runs/numbers [--ckpt PATH|best] [--testdir DIR] [--beam_size 4]
    python test.py --logdir runs/numbers --src a.de b.de --ref a.en b.en   # BLEU, chrF per pair

The model's shape and data dir come from LOGDIR/hparams.json. Writes TESTDIR/hypotheses.txt (one
line per source line, in order; an empty source line gets an empty hypothesis) and
TESTDIR/results.json. With --src/--ref, the source files are raw text translated as translate.py
--input translates them, and TESTDIR/hypotheses.N.txt (N counting the pairs from 1) and
TESTDIR/files.json are written instead, with one line per pair printed.

--min_confidence C: a hypothesis whose confidence (the geometric mean of its tokens' probabilities)
is below C is an empty line, with a note on stderr; results.json (files.json: per pair) records how
many were dropped. --prefix_file FILE: one target prefix per line of the test split's source,
cleaned and segmented as target text, which the line's translation (its first part, when it is
split) starts with; an empty line leaves its line free. With either, the test split's source text
is translated as translate.py --no_split --input translates it.
"""
import os

from toolkit.base import runtime  # first: TensorFlow's environment defaults

import json
import time

import tensorflow as tf

from data_load import eval_order, get_batch
from hparams import DECODING_FLAGS, Hparams, parse_flags
from toolkit.data.datadir import split_paths
from toolkit.base.errors import UserError
from toolkit.base.cli import run_cli
from toolkit.base.writing import atomic_write, check_output_dir, check_writable_dir
from toolkit.translating.sentences import best_translations, prefix_ids, read_input, read_pair
from toolkit.base.reading import read_lines
from toolkit.translating.trained_model import TrainedModel, read_dirs, trained_hparams
from toolkit.translating.translator import Translator
from utils import calc_bleu, calc_chrf, get_hypotheses

tf1 = tf.compat.v1


def parse_args(argv):
    """The model's hyperparameters: LOGDIR/hparams.json with the flags given on top. Only where the
    model is, how to decode and --testdir are flags; the model's shape and the training settings
    come from hparams.json."""
    parser = Hparams(DECODING_FLAGS + ("testdir",), "test.py").parser
    group = parser.add_argument_group("test.py")
    group.add_argument("--src", nargs="+", default=[], metavar="FILE",
                       help="score these source files (raw UTF-8 text) instead of the data dir's "
                            "test split, each against the --ref file in the same position")
    group.add_argument("--ref", nargs="+", default=[], metavar="FILE",
                       help="the reference translation of each --src file, line by line")
    group.add_argument("--prefix_file", default="", metavar="FILE",
                       help="one target prefix per line of the test split's source, which the "
                            "line's translation starts with (an empty line: none)")
    args, given = parse_flags(parser, argv)
    given.pop("prefix_file", None)
    hp = trained_hparams(args.logdir, given, src=args.src, ref=args.ref,
                         testdir=args.testdir or os.path.join(args.logdir, "test"),
                         prefix_file=args.prefix_file, min_confidence=args.min_confidence)
    if hp.prefix_file and (hp.src or hp.ref):
        raise UserError("--prefix_file %s holds a prefix per line of the test split: leave out "
                        "--src and --ref" % hp.prefix_file)
    # before the decode, which a bad --testdir would waste
    check_writable_dir(hp.testdir, "testdir")
    written = {os.path.basename(path) for path in output_paths(hp)}
    check_output_dir(hp.testdir, "testdir", {"src": hp.src, "ref": hp.ref,
                                             "prefix_file": hp.prefix_file}, read_dirs(hp),
                     written.__contains__)
    return hp


def output_paths(hp):
    """The files test.py writes in --testdir: with --src, a hypotheses file per pair and files.json;
    else the test split's hypotheses and results.json."""
    names = (["hypotheses.%d.txt" % number for number in range(1, len(hp.src) + 1)]
             + ["files.json"] if hp.src or hp.ref else ["hypotheses.txt", "results.json"])
    return [os.path.join(hp.testdir, name) for name in names]


def main(argv=None):
    runtime.start_graph_mode()
    hp = parse_args(argv)
    if hp.src or hp.ref:
        return score_files(hp)
    trained = TrainedModel(hp, hp.ckpt, ("test",))
    files = split_paths(hp.data_dir, trained.manifest, "test")
    start = time.time()
    if hp.prefix_file or hp.min_confidence:
        hypotheses, dropped, num_sentences = translate_source(trained, files["raw1"])
    else:
        (hypotheses, num_sentences), dropped = translate_split(trained), 0
    seconds = time.time() - start
    ckpt = trained.ckpt
    bleu, signature = calc_bleu(read_lines(files["raw2"]), hypotheses)

    atomic_write(os.path.join(hp.testdir, "hypotheses.txt"), "".join(h + "\n" for h in hypotheses))
    results = {"bleu": round(bleu, 2), "signature": signature, "sentences": num_sentences,
               "checkpoint": ckpt, "beam_size": hp.beam_size, "alpha": hp.alpha,
               "seconds": round(seconds, 2), "min_confidence": hp.min_confidence,
               "dropped_below_min_confidence": dropped}
    atomic_write(os.path.join(hp.testdir, "results.json"), json.dumps(results, indent=2) + "\n")
    print("BLEU = %.2f  %s  (%d sentences, %s, beam %d, %.1f s) -> %s"
          % (bleu, signature, num_sentences, os.path.basename(ckpt), hp.beam_size, seconds,
             hp.testdir))
    return 0


def translate_split(trained):
    """The test split's hypotheses through the data pipeline (its ids, in batches of
    --test_batch_size), in line order, and its number of sentences."""
    hp, manifest = trained.hp, trained.manifest
    batches, num_batches, num_sentences, _ = get_batch(hp.data_dir, manifest, "test", None, None,
                                                       hp.test_batch_size)
    if not num_sentences:
        raise UserError("the test split of %s is empty: nothing to translate; rebuild it with "
                        "prepro.py and a test set" % hp.data_dir)
    iterator = tf1.data.make_initializable_iterator(batches)
    xs, _ = iterator.get_next()
    ids, scores = trained.translation(xs)
    sp = trained.sentencepiece()
    with trained.session() as sess:
        try:
            hypotheses, _ = get_hypotheses(sess, iterator.initializer, ids, xs.x_seqlen,
                                           num_batches(), eval_order(hp.data_dir, manifest, "test"),
                                           sp, "test", scores)
        except FloatingPointError as error:
            raise UserError("%s with %s: its weights diverged; test an "
                            "earlier checkpoint with --ckpt" % (error, trained.ckpt)) from None
    return hypotheses, num_sentences


def translate_source(trained, source):
    """The hypotheses of the test split's source text (translate.py's way, each line whole, under
    --min_confidence and --prefix_file), how many were dropped below --min_confidence, and the
    number of sentences."""
    hp, lines = trained.hp, read_lines(source)
    if not lines:
        raise UserError("the test split of %s is empty: nothing to translate; rebuild it with "
                        "prepro.py and a test set" % hp.data_dir)
    sp, translator = trained.sentencepiece(), Translator(trained)
    try:
        prefixes = read_prefixes(hp.prefix_file, lines, source, sp)
        hypotheses, dropped = best_translations(translator, lines, sp, hp.maxlen1 - 1,
                                                "test line", hp.min_confidence, prefixes)
    finally:
        translator.close()
    return hypotheses, dropped, len(lines)


def read_prefixes(prefix_file, lines, source, sp):
    """Per line of the test source, the target prefix of --prefix_file (ids, [] for none); None
    without one. A different line count is a UserError naming both files."""
    if not prefix_file:
        return None
    texts = read_input(prefix_file, "prefix_file")
    if len(texts) != len(lines):
        raise UserError("--prefix_file %s has %d lines but the test source %s has %d: give one "
                        "prefix line (empty for none) per source line"
                        % (prefix_file, len(texts), source, len(lines)))
    return [prefix_ids(text, sp) for text in texts]


def score_files(hp):
    """test.py --src ... --ref ...: translates each source file and prints its BLEU and chrF against
    its reference file. Every file is read, and the pairs' line counts compared, before the
    model is loaded."""
    if len(hp.src) != len(hp.ref):
        raise UserError("%d --src files but %d --ref files: give one --ref file per --src file, in "
                        "the same order" % (len(hp.src), len(hp.ref)))
    pairs = [read_pair(source, reference, ("src", "ref")) for source,
             reference in zip(hp.src, hp.ref)]
    trained = TrainedModel(hp, hp.ckpt)
    sp, translator = trained.sentencepiece(), Translator(trained)
    ckpt = trained.ckpt
    results = []
    try:
        for number, (source, reference, (sources, references)) in enumerate(
                zip(hp.src, hp.ref, pairs), 1):
            hypotheses, dropped = best_translations(translator, sources, sp, hp.maxlen1 - 1,
                                                    "%s line" % source, hp.min_confidence)
            atomic_write(os.path.join(hp.testdir, "hypotheses.%d.txt" % number),
                         "".join(h + "\n" for h in hypotheses))
            bleu, signature = calc_bleu(references, hypotheses)
            results.append({"src": source, "ref": reference, "bleu": round(bleu, 2),
                            "chrf": round(calc_chrf(references, hypotheses), 2),
                            "sentences": len(sources), "dropped_below_min_confidence": dropped})
            print("%s: BLEU = %.2f  chrF = %.2f  (%d sentences, %s, beam %d)" % (
                source, bleu, results[-1]["chrf"], len(sources), os.path.basename(ckpt),
                hp.beam_size), flush=True)
    finally:
        translator.close()
    atomic_write(os.path.join(hp.testdir, "files.json"), json.dumps(
        {"pairs": results, "signature": signature, "checkpoint": ckpt, "beam_size": hp.beam_size,
         "alpha": hp.alpha}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_cli(main)
