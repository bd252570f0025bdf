"""Translates raw text with a trained model: sentences given as arguments, a file, or
standard input.

    python translate.py --logdir runs/multi30k "Ein Mann schläft." "Zwei Hunde spielen."
        # one line each
    python translate.py --logdir runs/multi30k --input src.de [--output hyp.en]
        # batched, in order
    python translate.py --logdir runs/multi30k
        # standard input: each line printed when done
    python translate.py --engine ctranslate2 --model ct2/multi30k "Ein Mann schläft."
        # export.py --format ctranslate2
    python translate.py --logdir runs/multi30k --input src.de --score ref.en
        # LOGPROB<TAB>NORMALIZED per pair
    options: --beam_size 4 --alpha 0.6 --nbest 4 --plot_attention DIR --ckpt PATH
             --test_batch_size 128

The model's shape and data dir come from LOGDIR/hparams.json; decoding flags of hparams.py
(--beam_size, --alpha, --max_len_a, --max_len_b, --ckpt, --data_dir, --test_batch_size) go on top.
Input is UTF-8 raw text, cleaned as prepro.py cleans training text (NFC, whitespace runs as one
space) and segmented with the data dir's bpe.model. With --engine ctranslate2 the model, its
bpe.model and decoding settings come from --model DIR.

Every input line gives exactly one output line (with --nbest N: up to N lines
`LINE ||| TRANSLATION ||| SCORE ||| CONFIDENCE`, LINE counted from 0, best first, SCORE and
CONFIDENCE with 4 decimals; under sampling, N samples). CONFIDENCE is the geometric mean of the
translation's tokens' probabilities under the model (</s> counted), exp(log p / tokens); for a line
of several sentences or parts, exp(the sum of their log p / the sum of their tokens). A line of
several sentences (a paragraph) is split into them by spaCy's rule-based sentencizer for the
source language, each translated alone (a model trained on single sentences drops or merges
sentences of a paragraph read whole), and their translations joined with the text that was between
them; --no_split translates every line whole, and --score never splits. Notes go to standard error:
  - an empty line gives an empty translation;
  - a sentence longer than the model's training limit (--maxlen1 pieces with </s>) is not cut off:
    it is split into parts that fit, after sentence punctuation (. ! ?) where possible, else
    after , ; :, else between words, else inside a word; the parts are translated separately and
    their translations joined with spaces (with --nbest, entry k joins the k-th best of every part
    and every sentence, and its score is the sum of their scores);
  - a file given by --input with invalid UTF-8 is an error naming the line, before anything is
    translated; on standard input such a line gives an empty translation and a note, and
    translation goes on.
--min_confidence C prints a translation whose confidence is below C as an empty line, with a note
on standard error naming the line and its confidence; with --nbest, the entries below C are left
out. --prefix_file FILE (with --input) holds one target prefix per line of --input, cleaned and
segmented as target text: the translation of the line's first sentence (its first part, when it is
split) starts with it; an empty line of FILE leaves its line free.
--output FILE is written beside FILE and renamed into place when translation ends: an interrupted
run leaves the old FILE (if any) as it was. A link is followed (its target replaced); a device,
FIFO, /dev/stdout or /dev/fd/N is written directly; the --input file is never an output. --output
and --plot_attention are checked before the model is loaded.
--score REF (with --input SRC) translates nothing: it prints, for each source line and the reference
line of REF beside it, `LOGPROB<TAB>NORMALIZED`: log p(reference + </s> | source) under the model
(teacher-forced, whole lines however long) and that divided by beam search's length penalty
((5 + length) / 6)^alpha, length counting </s>: the score --nbest prints for a translation, and
what beam search maximizes.
--plot_attention DIR writes DIR/positional_encoding.png and, per translated line, DIR/LINE.png (LINE
counted from 1; DIR/LINE-PART.png for a split line) with the cross-attention heads of the last
decoder block.
"""
import contextlib
import functools
import math
import sys

from toolkit.base import runtime  # first: TensorFlow's environment defaults

from data_load import run_in_length_batches
from decoding import DecodingSettings
from hparams import DECODING_FLAGS, Hparams, check_ranges, parse_flags
from toolkit.data import datadir
from toolkit.translating import ctranslate2_engine, documents
from toolkit.base.errors import UserError
from toolkit.base.cli import run_cli
from toolkit.base.ids import EOS_ID
from toolkit.base.writing import atomic_file, check_not_an_input, check_writable_file
from toolkit.translating.sentences import (confidence_notes, output_lines, prefix_ids, prepare,
                                           prepare_line, read_input, read_pair, report,
                                           stdin_lines, translated_lines, translation_entries)
from toolkit.translating.trained_model import (TrainedModel, decoding_flags, read_dirs,
                                               trained_hparams)
from toolkit.translating.translator import Translator, ctranslate2_translator


# ---------------------------------------------------------------- flags
def build_parser():
    """hparams.py's parser with its decoding flags and the arguments and flags
    of translate.py alone."""
    parser = Hparams(DECODING_FLAGS, "translate.py", "Translate raw text with a trained model "
                     "(see the top of translate.py).").parser
    group = parser.add_argument_group("translate.py")
    group.add_argument("sentences", nargs="*", metavar="SENTENCE",
                       help="sentences to translate; without any, --input FILE or standard "
                            "input is read")
    group.add_argument("--input", default="", metavar="FILE",
                       help="UTF-8 file with one sentence per line, translated in "
                            "batches of --test_batch_size")
    group.add_argument("--output", default="", metavar="FILE",
                       help="write the translations to FILE instead of standard output")
    group.add_argument("--nbest", type=int, default=1, metavar="N",
                       help="print the N best translations with their scores and confidences "
                            "(needs --beam_size N or more, or sampling: N samples)")
    group.add_argument("--prefix_file", default="", metavar="FILE",
                       help="with --input: one target prefix per line of --input, which the "
                            "translation of the line's first sentence starts with (an empty "
                            "line: none)")
    group.add_argument("--plot_attention", default="", metavar="DIR",
                       help="write attention heat maps (PNG) of every translated line and of the "
                            "positional encoding to DIR")
    group.add_argument("--score", default="", metavar="REF",
                       help="with --input SRC: print LOGPROB<TAB>NORMALIZED of each line of REF as "
                            "the translation of the line of SRC beside it (forced decoding; "
                            "NORMALIZED divides by the length penalty of --alpha) "
                            "instead of translating")
    group.add_argument("--engine", choices=["tensorflow", "ctranslate2"], default="tensorflow",
                       help="tensorflow (default): the checkpoint in --logdir; ctranslate2: the "
                            "model directory --model written by export.py --format ctranslate2 "
                            "(its decoding settings, which the decoding flags override)")
    group.add_argument("--no_split", action="store_true",
                       help="translate each line whole, as before, instead of each of its "
                            "sentences alone (spaCy's rule-based sentencizer), joined back with "
                            "the text between them")
    group.add_argument("--model", default="", metavar="DIR",
                       help="with --engine ctranslate2: the exported model directory")
    return parser


def parse_args(argv):
    """Returns hp (hparams.json of --logdir, or the settings of an exported CTranslate2 --model,
    with the decoding flags of argv on top) and args (every flag, including those
    of translate.py alone)."""
    args, given = parse_flags(build_parser(), argv, intermixed=True)
    if args.ensemble and args.engine == "ctranslate2":
        raise UserError("--ensemble decodes with the TensorFlow engine: leave out --engine "
                        "ctranslate2, or --ensemble")
    hp = ctranslate2_hparams(args, given) if args.engine == "ctranslate2" else trained_hparams(
        args.logdir, decoding_flags(given))
    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both")
    if not (args.sentences or args.input) and sys.stdin is None:
        raise UserError("standard input is closed and no sentences are given: give sentences as "
                        "arguments, --input FILE, or text on standard input")
    if not args.output and sys.stdout is None:
        raise UserError("standard output is closed: pass --output FILE, or let the translations go "
                        "to standard output")
    check_ranges(args, ("nbest",))
    inputs = {"input": args.input, "score": args.score, "prefix_file": args.prefix_file}
    dirs = {"model directory": args.model} if args.engine == "ctranslate2" else read_dirs(hp)
    if args.output:
        check_writable_file(args.output, "output")
        check_not_an_input(args.output, "output", inputs, dirs)
    if args.plot_attention:
        # matplotlib, when plots are asked for
        from toolkit.translating.attention_plots import check_plot_dir
        check_plot_dir(args.plot_attention, "plot_attention", inputs, dirs)
    if args.nbest > hp.beam_size and not DecodingSettings.from_flags(hp).samples():
        raise UserError("--nbest %d needs --beam_size %d or more (now %d), or sampling"
                        % (args.nbest, args.nbest, hp.beam_size))
    check_score_flags(args)
    if args.prefix_file and not args.input:
        raise UserError("--prefix_file %s holds a prefix per line of --input: give --input FILE"
                        % args.prefix_file)
    return hp, args


def check_score_flags(args):
    """--score REF scores the lines of --input SRC with the TensorFlow engine, and
    prints nothing else."""
    if not args.score:
        return
    if not args.input:
        raise UserError("--score %s needs --input SRC, the source of each of its lines"
                        % args.score)
    others = [flag for flag,
              given in (("--nbest", args.nbest > 1), ("--plot_attention", args.plot_attention),
                        ("--prefix_file", args.prefix_file),
                                       ("--engine ctranslate2", args.engine == "ctranslate2"))
              if given]
    if others:
        raise UserError("--score prints scores, not translations: leave out %s" % ", ".join(others))


def ctranslate2_hparams(args, given):
    """The settings of --model DIR (export.py --format ctranslate2) with the decoding flags
    given on top."""
    hp = ctranslate2_engine.exported_hparams(args.model, given, args.test_batch_size, args.threads)
    if args.plot_attention:
        raise UserError("--plot_attention needs --engine tensorflow")
    return hp


# ---------------------------------------------------------------- text out
def attention_plots(directory, sp, d_model):
    """The writer of --plot_attention DIR's PNGs (matplotlib is imported only when plots
    are asked for)."""
    from toolkit.translating.attention_plots import AttentionPlots
    return AttentionPlots(directory, sp, d_model)


# ---------------------------------------------------------------- modes
def translate_all(translator, lines, sp, limit, split, args, plots, out, where, prefixes=None):
    """Translates a list of lines in batches and writes one output line (or n-best block) per
    line, in order. prefixes: None, or per line its target prefix (ids, [] for none)."""
    for number, line in enumerate(translated_lines(translator, lines, sp, limit, where, split,
                                                   prefixes), 1):
        write_line(out, number, *line, args, plots, where)


def read_prefixes(args, lines, sp):
    """Per line of --input, the target prefix of --prefix_file (ids, [] for none); None without
    --prefix_file. A different line count is a UserError naming both files."""
    if not args.prefix_file:
        return None
    texts = read_input(args.prefix_file, "prefix_file")
    if len(texts) != len(lines):
        raise UserError("--prefix_file %s has %d lines but --input %s has %d: give one prefix "
                        "line (empty for none) per input line"
                        % (args.prefix_file, len(texts), args.input, len(lines)))
    return [prefix_ids(text, sp) for text in texts]


def score_all(translator, sources, references, sp, out):
    """Writes `LOGPROB<TAB>NORMALIZED` of each reference line given its source line
    (--score), in order."""
    source_ids, target_ids = ([forced_ids(text, sp, where, number) for number,
                               text in enumerate(lines, 1)]
                              for where,
                              lines in (("--input line", sources), ("--score line", references)))
    for log_prob, normalized in translator.score(source_ids, target_ids):
        out.write("%.6f\t%.6f\n" % (log_prob, normalized))


def forced_ids(text, sp, where, number):
    """The ids of a whole line (never split: scoring reads it at any length) ending in </s>; an
    empty line is </s> alone. Notes about it go to stderr."""
    parts, notes = prepare(text, sp, math.inf)
    report(where, number, notes if parts else ["is empty: scored as </s> alone"])
    return parts[0] if parts else [EOS_ID]


def translate_stream(translator, sp, limit, split, args, plots, out):
    """Translates standard input line by line, writing each translation as soon as it is ready."""
    for number, text in enumerate(stdin_lines(), 1):
        document, segments, notes = prepare_line(text, sp, limit, split)
        report("line", number, notes)
        inputs = [source for parts in segments for source in parts]
        results = run_in_length_batches(translator.run, inputs,
                                        translator.batch_size) if inputs else []
        entries = translation_entries(document, segments, results, sp)
        write_line(out, number, inputs, results, entries, args, plots)


def write_line(out, number, inputs, results, entries, args, plots, where="line"):
    """Writes the translation of input line `number` (its n-best entries above --min_confidence,
    a note on one below it) and flushes; draws the attention of its model inputs with
    --plot_attention."""
    report(where, number, confidence_notes(entries, args.min_confidence))
    out.write("".join(line + "\n" for line in output_lines(number, entries, args.nbest,
                                                           args.min_confidence)))
    out.flush()
    if plots and inputs:
        plots.write(number, inputs, results)


def main(argv=None):
    runtime.start_graph_mode()
    hp, args = parse_args(argv)
    if args.score:
        lines, references = read_pair(args.input, args.score, ("input", "score"))
    else:
        lines = read_input(args.input) if args.input else args.sentences
    if args.engine == "ctranslate2":
        translator = ctranslate2_translator(args.model, hp, args.nbest)
        sp, recorded = translator.sp, vars(hp)  # the export's settings keep the languages
    else:
        trained = TrainedModel(hp, hp.ckpt)
        sp, recorded = trained.sentencepiece(), trained.manifest
        translator = Translator(trained, args.nbest, bool(args.plot_attention),
                                scoring=bool(args.score))
    plots = attention_plots(args.plot_attention, sp, hp.d_model) if args.plot_attention else None
    limit = hp.maxlen1 - 1  # pieces, leaving room for </s>
    # each sentence of a line translated alone, unless --no_split
    split = None if args.no_split else functools.partial(
        documents.split, lang=datadir.languages(recorded)[0])
    with contextlib.ExitStack() as stack:
        stack.callback(translator.close)
        # --output FILE is written beside FILE and renamed into place at the end: an interruption
        # keeps the old FILE
        out = stack.enter_context(atomic_file(args.output,
                                              text=True)) if args.output else sys.stdout
        if args.score:
            score_all(translator, lines, references, sp, out)
        elif args.input or args.sentences:
            translate_all(translator, lines, sp, limit, split, args, plots, out,
                          "line" if args.input else "sentence", read_prefixes(args, lines, sp))
        else:
            translate_stream(translator, sp, limit, split, args, plots, out)
    return 0


if __name__ == "__main__":
    run_cli(main)
