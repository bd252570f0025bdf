"""Translates raw text with a trained model: sentences given as arguments, a file, or standard input.

    python translate.py --logdir runs/multi30k "Ein Mann schläft." "Zwei Hunde spielen."   # one line each
    python translate.py --logdir runs/multi30k --input src.de [--output hyp.en]          # batched, in order
    python translate.py --logdir runs/multi30k                # standard input: each line printed when done
    python translate.py --engine ctranslate2 --model ct2/multi30k "Ein Mann schläft."   # export.py --format ctranslate2
    python translate.py --logdir runs/multi30k --input src.de --score ref.en   # LOGPROB<TAB>NORMALIZED per pair
    options: --beam_size 4 --alpha 0.6 --nbest 4 --plot_attention DIR --ckpt PATH --test_batch_size 128

The model's shape and data dir come from LOGDIR/hparams.json; decoding flags of hparams.py (--beam_size,
--alpha, --max_len_a, --max_len_b, --ckpt, --data_dir, --test_batch_size) go on top. Input is UTF-8 raw text,
cleaned as prepro.py cleans training text (NFC, whitespace runs as one space) and segmented with the data
dir's bpe.model. With --engine ctranslate2 the model, its bpe.model and decoding settings come from --model DIR.

Every input line gives exactly one output line (with --nbest N: up to N lines `LINE ||| TRANSLATION ||| SCORE`,
LINE counted from 0, best first). Notes go to standard error:
  - an empty line gives an empty translation;
  - a line longer than the model's training limit (--maxlen1 pieces with </s>) is not cut off: it is split into
    parts that fit, after sentence punctuation (. ! ?) where possible, else after , ; :, else between words,
    else inside a word; the parts are translated separately and their translations joined with spaces
    (with --nbest, entry k joins the k-th best of every part, and its score is the sum of their scores);
  - a file given by --input with invalid UTF-8 is an error naming the line, before anything is translated;
    on standard input such a line gives an empty translation and a note, and translation goes on.
--output FILE is written beside FILE and renamed into place when translation ends: an interrupted run leaves the
old FILE (if any) as it was. A link is followed (its target replaced); a device, FIFO, /dev/stdout or /dev/fd/N is
written directly; the --input file is never an output. --output and --plot_attention are checked before the model
is loaded.
--score REF (with --input SRC) translates nothing: it prints, for each source line and the reference line of REF
beside it, `LOGPROB<TAB>NORMALIZED`: log p(reference + </s> | source) under the model (teacher-forced, whole
lines however long) and that divided by beam search's length penalty ((5 + length) / 6)^alpha, length counting
</s>: the score --nbest prints for a translation, and what beam search maximizes.
--plot_attention DIR writes DIR/positional_encoding.png and, per translated line, DIR/LINE.png (LINE counted
from 1; DIR/LINE-PART.png for a split line) with the cross-attention heads of the last decoder block.
"""
import argparse
import contextlib
import math
import os

from toolkit import runtime  # first: TensorFlow's environment defaults

import sys

import sentencepiece as spm
import tensorflow as tf

from toolkit import ctranslate2_engine
import decoding
from data_load import Sources, pad, run_in_length_batches
from toolkit.datadir import bpe_model_path
from toolkit.errors import UserError, run_cli
from hparams import DECODING_FLAGS, Hparams, check_ranges, parse_flags
from toolkit.logdir import load_trained_hparams, restore, trained_model_files
from model import ModelConfig, build_transformer
from modules import positional_encoding
from toolkit.ids import EOS_ID, PAD_ID, UNK_ID
from toolkit.outputs import atomic_file, check_not_an_input, check_writable_dir, check_writable_file
from toolkit.textfiles import clean_line, decode_lines
from utils import postprocess

tf1 = tf.compat.v1

#: Where a too-long line may be cut, best first: (description, test of the cut before pieces[k]).
CUT_RULES = (
    ("after sentence punctuation", lambda pieces, k: pieces[k - 1].endswith((".", "!", "?"))),
    ("after , ; or :", lambda pieces, k: pieces[k - 1].endswith((",", ";", ":"))),
    ("between words", lambda pieces, k: pieces[k].startswith("\u2581")),
    ("inside a word", lambda pieces, k: True),
)
#: Positions drawn in DIR/positional_encoding.png.
PLOTTED_POSITIONS = 100


# ---------------------------------------------------------------- flags
def build_parser():
    """hparams.py's parser with its decoding flags and the arguments and flags of translate.py alone."""
    parser = Hparams(DECODING_FLAGS, "translate.py", "Translate raw text with a trained model (see the top of "
                                                     "translate.py).").parser
    group = parser.add_argument_group("translate.py")
    group.add_argument("sentences", nargs="*", metavar="SENTENCE",
                       help="sentences to translate; without any, --input FILE or standard input is read")
    group.add_argument("--input", default="", metavar="FILE",
                       help="UTF-8 file with one sentence per line, translated in batches of --test_batch_size")
    group.add_argument("--output", default="", metavar="FILE",
                       help="write the translations to FILE instead of standard output")
    group.add_argument("--nbest", type=int, default=1, metavar="N",
                       help="print the N best translations with their scores (needs --beam_size N or more)")
    group.add_argument("--plot_attention", default="", metavar="DIR",
                       help="write attention heat maps (PNG) of every translated line and of the positional "
                            "encoding to DIR")
    group.add_argument("--score", default="", metavar="REF",
                       help="with --input SRC: print LOGPROB<TAB>NORMALIZED of each line of REF as the translation "
                            "of the line of SRC beside it (forced decoding; NORMALIZED divides by the length penalty "
                            "of --alpha) instead of translating")
    group.add_argument("--engine", choices=["tensorflow", "ctranslate2"], default="tensorflow",
                       help="tensorflow (default): the checkpoint in --logdir; ctranslate2: the model directory "
                            "--model written by export.py --format ctranslate2 (its decoding settings, which the "
                            "decoding flags override)")
    group.add_argument("--model", default="", metavar="DIR",
                       help="with --engine ctranslate2: the exported model directory")
    return parser


def parse_args(argv):
    """Returns hp (hparams.json of --logdir, or the settings of an exported CTranslate2 --model, with the decoding
    flags of argv on top) and args (every flag, including those of translate.py alone)."""
    args, given = parse_flags(build_parser(), argv, intermixed=True)
    hp = ctranslate2_hparams(args, given) if args.engine == "ctranslate2" else trained_hparams(args.logdir, given)
    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both")
    if not (args.sentences or args.input) and sys.stdin is None:
        raise UserError("standard input is closed and no sentences are given: give sentences as arguments, "
                        "--input FILE, or text on standard input")
    if not args.output and sys.stdout is None:
        raise UserError("standard output is closed: pass --output FILE, or let the translations go to standard "
                        "output")
    check_ranges(args, ("nbest",))
    if args.output:
        check_writable_file(args.output, "output")
        check_not_an_input(args.output, "output", {"input": args.input})
    if args.plot_attention:
        check_writable_dir(args.plot_attention, "plot_attention")
    if args.nbest > hp.beam_size:
        raise UserError("--nbest %d needs --beam_size %d or more (now %d)" % (args.nbest, args.nbest, hp.beam_size))
    check_score_flags(args)
    return hp, args


def trained_hparams(logdir, given):
    """LOGDIR/hparams.json with the decoding flags of `given` (parse_flags' dict) on top, precision resolved."""
    hp = load_trained_hparams(logdir, {flag: value for flag, value in given.items() if flag in DECODING_FLAGS})
    runtime.resolve_precision(hp)
    return hp


def check_score_flags(args):
    """--score REF scores the lines of --input SRC with the TensorFlow engine, and prints nothing else."""
    if not args.score:
        return
    if not args.input:
        raise UserError("--score %s needs --input SRC, the source of each of its lines" % args.score)
    others = [flag for flag, given in (("--nbest", args.nbest > 1), ("--plot_attention", args.plot_attention),
                                       ("--engine ctranslate2", args.engine == "ctranslate2")) if given]
    if others:
        raise UserError("--score prints scores, not translations: leave out %s" % ", ".join(others))


def ctranslate2_hparams(args, given):
    """The settings of --model DIR (export.py --format ctranslate2) with the decoding flags given on top."""
    if not args.model:
        raise UserError("--engine ctranslate2 needs --model DIR, a directory written by export.py --format "
                        "ctranslate2")
    if args.plot_attention:
        raise UserError("--plot_attention needs --engine tensorflow")
    try:
        settings = ctranslate2_engine.read_settings(args.model)
    except (OSError, ValueError):
        raise UserError("--model %s is not a directory written by export.py --format ctranslate2 (no readable %s)"
                        % (args.model, ctranslate2_engine.SETTINGS_FILE)) from None
    hp = argparse.Namespace(**{**settings, "test_batch_size": args.test_batch_size, "threads": args.threads})
    vars(hp).update({flag: given[flag] for flag in ("beam_size", "alpha", "max_len_a", "max_len_b") if flag in given})
    check_ranges(hp, ("beam_size", "alpha", "max_len_a", "max_len_b", "test_batch_size", "threads"))
    return hp


# ---------------------------------------------------------------- text in
def read_input(fpath, flag="input"):
    """Lines of a UTF-8 file given as --flag ('\\r\\n', a byte-order mark and a missing final newline are fine).
    Invalid UTF-8 is a UserError naming the line."""
    try:
        with open(fpath, "rb") as f:
            data = f.read()
        return decode_lines(data, fpath)
    except OSError as error:
        raise UserError("cannot read --%s %s: %s" % (flag, fpath, error.strerror)) from None


def read_pair(source, reference, flags):
    """The lines of a source file and of its reference file, given as flags (two names); a different number of
    lines is a UserError."""
    sources, references = read_input(source, flags[0]), read_input(reference, flags[1])
    if len(sources) != len(references):
        raise UserError("--%s %s has %d lines but --%s %s has %d: give one reference line per source line"
                        % (flags[0], source, len(sources), flags[1], reference, len(references)))
    return sources, references


def stdin_lines():
    """Yields each line of standard input as soon as it is complete, without its line ending; None for a line
    that is not valid UTF-8. Shows a prompt on stderr when standard input is a terminal."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a sentence and press Enter; Ctrl-D ends.", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = sys.stdin.buffer.readline()
        if not raw:
            return
        raw = raw.rstrip(b"\n").rstrip(b"\r").removeprefix(b"\xef\xbb\xbf")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        yield text


def best_cut(pieces, limit):
    """Where to cut pieces (longer than limit): (k in 1..limit, so that pieces[:k] is the first part, and the
    CUT_RULES description of the cut). The best kind of cut wins; among equals, the longest first part."""
    for description, allowed in CUT_RULES:
        for k in range(limit, 0, -1):
            if allowed(pieces, k):
                return k, description


def split_pieces(pieces, limit):
    """Splits a list of pieces into parts of at most limit pieces (see best_cut).

    Returns the parts and the descriptions of the cuts made (empty when pieces fit)."""
    parts, cuts = [], []
    while len(pieces) > limit:
        k, description = best_cut(pieces, limit)
        parts.append(pieces[:k])
        cuts.append(description)
        pieces = pieces[k:]
    return parts + [pieces], cuts


def prepare(text, sp, limit):
    """Raw text -> (parts, notes): parts is a list of source id lists, each ending in </s> and at most limit + 1
    long ([] for an empty line); notes are the things to tell the user about this line."""
    if text is None:
        return [], ["is not valid UTF-8; printed an empty line"]
    pieces = sp.encode(clean_line(text), out_type=str)
    if not pieces:
        return [], ["is empty; printed an empty line"]
    notes = []
    unknown = sorted({p for p in pieces if sp.piece_to_id(p) == UNK_ID})
    if unknown:
        notes.append("has pieces outside the model's vocabulary, read as <unk>: %s" % " ".join(unknown))
    piece_parts, cuts = split_pieces(pieces, limit)
    if cuts:
        kinds = [description for description, _ in CUT_RULES if description in cuts]
        notes.append("has %d pieces, more than the %d (and </s>) the model was trained on (--maxlen1 %d): "
                     "translated in %d parts, cut %s" % (len(pieces), limit, limit + 1, len(piece_parts),
                                                         ", ".join(kinds)))
    return [[sp.piece_to_id(p) for p in part] + [EOS_ID] for part in piece_parts], notes


# ---------------------------------------------------------------- the model
class Translator:
    """One decoding graph over placeholders (or, scoring, one teacher-forced graph), and a session with the
    checkpoint restored."""

    def __init__(self, hp, ckpt, nbest=1, with_attention=False, scoring=False):
        self.batch_size = hp.test_batch_size
        self.x = tf1.placeholder(tf.int32, [None, None], name="x")  # (N, T1) source ids + </s>, padded with 0
        self.x_seqlen = tf1.placeholder(tf.int32, [None], name="x_seqlen")  # (N,)
        self.targets = tf1.placeholder(tf.int32, [None, None], name="targets")  # (N, T2) ids ending in </s>
        xs = Sources(self.x, self.x_seqlen)
        model = build_transformer(ModelConfig.from_flags(hp))
        self.attention = None
        if scoring:
            log_probs = model.score(xs, self.targets, alpha=0.0)  # (N,): a penalty of 1
            lengths = tf.reduce_sum(tf.cast(tf.not_equal(self.targets, PAD_ID), tf.int32), axis=1)  # with </s>
            self.forced_scores = log_probs, log_probs / decoding.length_penalty(lengths, hp.alpha)
        else:
            # (N, nbest, T), (N, nbest): best first
            self.nbest_ids, self.nbest_scores = decoding.nbest(model, xs, decoding.DecodingSettings.from_flags(hp),
                                                               nbest)
        if with_attention:
            self.attention = model.attention(xs, self.targets)  # (N, h, T2, T1)
        runtime.release_library_pages()  # TensorFlow's start-up code, run once: out of the resident set
        self.sess = tf1.Session(config=runtime.session_config(hp))
        restore(self.sess, ckpt, hp.logdir, follow_latest=not hp.ckpt)

    def run(self, sources, with_attention=True):
        """sources: list of N id lists, each ending in </s>. with_attention: run the attention pass (a translator
        built with_attention) for these sources; False skips it.

        Returns per source: nbest ids (K, T) ending in </s> then 0s, scores (K,) (a slot beam search could not fill
        scores NEG_INF), and the best translation's attention (h, T2, T1), or None without it.
        """
        x, x_seqlen = pad(sources)
        feed = {self.x: x, self.x_seqlen: x_seqlen}
        ids, scores = self.sess.run([self.nbest_ids, self.nbest_scores], feed)
        attention = [None] * len(sources)
        if self.attention is not None and with_attention:
            attention = self.sess.run(self.attention, {**feed, self.targets: ids[:, 0, :]})
        return list(zip(ids, scores, attention))

    def score(self, sources, targets):
        """sources, targets: lists of N id lists, each ending in </s>. Returns per pair (log p(target | source),
        log p / length penalty), in batches of batch_size pairs taken in order."""
        scores = []
        for start in range(0, len(sources), self.batch_size):
            (x, x_seqlen), (y, _) = (pad(ids[start:start + self.batch_size]) for ids in (sources, targets))
            batch = self.sess.run(self.forced_scores, {self.x: x, self.x_seqlen: x_seqlen, self.targets: y})
            scores.extend(zip(*batch))
        return scores

    def close(self):
        self.sess.close()


def ctranslate2_translator(model_dir, hp, nbest):
    """A ctranslate2_engine.Translator for --model DIR; a UserError when ctranslate2 is missing."""
    try:
        return ctranslate2_engine.Translator(model_dir, decoding.DecodingSettings.from_flags(hp), hp.test_batch_size,
                                             nbest, threads=hp.threads)
    except ImportError:
        raise UserError("--engine ctranslate2 needs the ctranslate2 package: pip install -r requirements.txt") \
            from None
    except RuntimeError as error:
        raise UserError("cannot load the CTranslate2 model in %s: %s" % (model_dir, error)) from None


# ---------------------------------------------------------------- text out
def nbest_texts(part_results, sp):
    """part_results: the translator's results of one line's parts. Returns [(text, score)], best first: entry k
    joins the k-th best translation of every part, with the sum of their scores."""
    texts = [postprocess(ids, sp) for ids, _, _ in part_results]  # per part, K texts
    entries = []
    for k in range(len(texts[0])):
        part_scores = [scores[k] for _, scores, _ in part_results]
        if min(part_scores) > decoding.NEG_INF / 2:
            entries.append((" ".join(part[k] for part in texts), float(sum(part_scores))))
    return entries


def output_lines(number, entries, nbest):
    """The lines printed for input line `number` (1-based): the best text, or with nbest > 1 up to nbest lines
    `number-1 ||| text ||| score`. entries: [(text, score)], best first; [] for an empty line."""
    if nbest == 1:
        return [entries[0][0] if entries else ""]
    return ["%d ||| %s ||| %.4f" % (number - 1, text, score) for text, score in entries] or [
        "%d |||  ||| 0.0000" % (number - 1)]


class AttentionPlots:
    """Writes the PNGs of --plot_attention DIR (plot_attention.py, and so matplotlib, is imported only here)."""

    def __init__(self, directory, sp, d_model):
        import plot_attention
        self.plot = plot_attention
        self.directory, self.sp = directory, sp
        os.makedirs(directory, exist_ok=True)
        with tf.Graph().as_default(), tf1.Session() as sess:
            encoding = sess.run(positional_encoding(tf.zeros([1, PLOTTED_POSITIONS, d_model])))[0]
        plot_attention.plot_positional_encoding(encoding, os.path.join(directory, "positional_encoding.png"))

    def pieces(self, ids):
        """Labels of ids (a list ending in </s>)."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def write(self, number, sources, part_results):
        """One PNG per part of input line `number`: DIR/NNNN.png, or DIR/NNNN-P.png for a split line."""
        for part, (source, (ids, _, attention)) in enumerate(zip(sources, part_results), 1):
            target = [int(i) for i in ids[0] if i != PAD_ID]
            name = "%04d.png" % number if len(sources) == 1 else "%04d-%d.png" % (number, part)
            title = "line %d%s: last decoder block's cross-attention" % (
                number, "" if len(sources) == 1 else ", part %d" % part)
            self.plot.plot_attention_heads(attention[:, :len(target), :len(source)], self.pieces(source),
                                           self.pieces(target), os.path.join(self.directory, name), title)


def report(where, number, notes):
    """Prints the notes about one input line on stderr."""
    for note in notes:
        print("%s %d %s" % (where, number, note), file=sys.stderr, flush=True)


# ---------------------------------------------------------------- modes
def translated_lines(translator, lines, sp, limit, where):
    """Translates a list of lines in batches; yields each line's parts and their results (Translator.run), in
    order. Notes about the lines go to stderr, `where` naming them."""
    prepared = [prepare(text, sp, limit) for text in lines]
    for number, (_, notes) in enumerate(prepared, 1):
        report(where, number, notes)
    sources = [source for parts, _ in prepared for source in parts]
    results = iter(run_in_length_batches(translator.run, sources, translator.batch_size, progress=True))
    for parts, _ in prepared:
        yield parts, [next(results) for _ in parts]


def translate_all(translator, lines, sp, limit, args, plots, out, where):
    """Translates a list of lines in batches and writes one output line (or n-best block) per line, in order."""
    for number, (parts, part_results) in enumerate(translated_lines(translator, lines, sp, limit, where), 1):
        write_line(out, number, parts, part_results, sp, args.nbest, plots)


def best_translations(translator, lines, sp, limit, where):
    """The best translation of each of a list of lines, in order ("" for an empty line)."""
    return [output_lines(number, nbest_texts(part_results, sp) if parts else [], 1)[0]
            for number, (parts, part_results) in enumerate(translated_lines(translator, lines, sp, limit, where), 1)]


def score_all(translator, sources, references, sp, out):
    """Writes `LOGPROB<TAB>NORMALIZED` of each reference line given its source line (--score), in order."""
    source_ids, target_ids = ([forced_ids(text, sp, where, number) for number, text in enumerate(lines, 1)]
                              for where, lines in (("--input line", sources), ("--score line", references)))
    for log_prob, normalized in translator.score(source_ids, target_ids):
        out.write("%.6f\t%.6f\n" % (log_prob, normalized))


def forced_ids(text, sp, where, number):
    """The ids of a whole line (never split: scoring reads it at any length) ending in </s>; an empty line is
    </s> alone. Notes about it go to stderr."""
    parts, notes = prepare(text, sp, math.inf)
    report(where, number, notes if parts else ["is empty: scored as </s> alone"])
    return parts[0] if parts else [EOS_ID]


def translate_stream(translator, sp, limit, args, plots, out):
    """Translates standard input line by line, writing each translation as soon as it is ready."""
    for number, text in enumerate(stdin_lines(), 1):
        parts, notes = prepare(text, sp, limit)
        report("line", number, notes)
        part_results = run_in_length_batches(translator.run, parts, translator.batch_size) if parts else []
        write_line(out, number, parts, part_results, sp, args.nbest, plots)


def write_line(out, number, parts, part_results, sp, nbest, plots):
    """Writes the translation of input line `number` and flushes; draws its attention with --plot_attention."""
    entries = nbest_texts(part_results, sp) if parts else []
    out.write("".join(line + "\n" for line in output_lines(number, entries, nbest)))
    out.flush()
    if plots and parts:
        plots.write(number, parts, part_results)


def main(argv=None):
    tf1.disable_eager_execution()
    tf1.reset_default_graph()  # main() may run more than once in a process (tests)
    tf.get_logger().setLevel("ERROR")
    hp, args = parse_args(argv)
    if args.score:
        lines, references = read_pair(args.input, args.score, ("input", "score"))
    else:
        lines = read_input(args.input) if args.input else args.sentences
    if args.engine == "ctranslate2":
        translator = ctranslate2_translator(args.model, hp, args.nbest)
        sp = translator.sp
    else:
        manifest, ckpt = trained_model_files(hp, hp.ckpt)
        sp = spm.SentencePieceProcessor(model_file=bpe_model_path(hp.data_dir, manifest))
        translator = Translator(hp, ckpt, args.nbest, bool(args.plot_attention), scoring=bool(args.score))
    plots = AttentionPlots(args.plot_attention, sp, hp.d_model) if args.plot_attention else None
    limit = hp.maxlen1 - 1  # pieces, leaving room for </s>
    with contextlib.ExitStack() as stack:
        stack.callback(translator.close)
        # --output FILE is written beside FILE and renamed into place at the end: an interruption keeps the old FILE
        out = stack.enter_context(atomic_file(args.output, text=True)) if args.output else sys.stdout
        if args.score:
            score_all(translator, lines, references, sp, out)
        elif args.input or args.sentences:
            translate_all(translator, lines, sp, limit, args, plots, out, "line" if args.input else "sentence")
        else:
            translate_stream(translator, sp, limit, args, plots, out)
    return 0


if __name__ == "__main__":
    run_cli(main)
