"""Turn a parallel corpus into a data directory that training and testing read.

Usage: ``python prepro.py --dataset {numbers,multi30k,iwslt2016,files} [--data_dir DIR] [options]``
(``python prepro.py --help`` explains every flag).

Side 1 is the source language and side 2 the target everywhere; "eval" is the dev split.
The data directory (default ``data/NAME``) is laid out as datadir.py describes.

The corpus is streamed: read, cleaned and written line by line, and encoded a chunk of lines at a
time with every core, so memory does not grow with it. BPE is trained on every training sentence, or
on a random sample of databuild.BPE_SAMPLE_SENTENCES sentences when train has more (the manifest
says which). Cleaning keeps every line: it strips '\\r' and surrounding whitespace, collapses inner
whitespace to single spaces and applies Unicode NFC.  Training pairs with an empty side are dropped;
duplicate pairs and pairs whose sides differ in length by more than ``--max_ratio`` (in BPE pieces)
are reported (repeats found by a 64-bit hash of each pair), and dropped from train with
``--dedup`` / ``--filter_ratio``.  Dev and test lines are never dropped or reordered, and an empty
dev or test split is refused.  Input files may be gzip-compressed.  A build is published only once
it is complete (see datadir.py), so a failed rebuild (--force) leaves the previous build usable.
Re-running with the same inputs and options does nothing; other inputs or options need another
--data_dir or --force.
"""

import math
import sys
import time
from pathlib import Path

from hparams import HPARAMS_NAME, LARGEST
from toolkit.data.corpora import FILE_FLAGS, SPLITS, file_splits, log, reversed_corpus
from toolkit.data.corpora.download import (IWSLT2016_URL, MULTI30K_URL, iwslt2016_splits,
                                           multi30k_splits)
from toolkit.data.corpora.numbers import numbers_corpus
from toolkit.data.build import build_data_dir, read_bpe_model
from toolkit.data.datadir import (DEFAULT_LANGUAGES, MANIFEST_NAME, check_build_owned,
                                  check_data_dir, check_inputs_kept)
from toolkit.base.errors import USER_ERROR_EXIT_CODE, UserError, error_line, report
from toolkit.base.cli import OneLineParser, interrupted_exit_code, run_cli
from toolkit.base.ids import SPECIAL_PIECES
from toolkit.base.reading import shown_number
from toolkit.base.writing import check_not_owned, check_writable_dir

DATASETS = ("numbers", "multi30k", "iwslt2016", "files")
DEFAULT_VOCAB_SIZE = {"numbers": 1000, "multi30k": 32000, "iwslt2016": 32000, "files": 32000}
DEFAULT_MAX_RATIO = 9.0


DATASET_FLAGS = {
    "numbers": ("seed", "n_train", "n_eval", "n_test"),
    "multi30k": ("url", "no_verify"),
    "iwslt2016": ("url",),
    "files": tuple(FILE_FLAGS.values()) + ("src_lang", "tgt_lang"),
}


def build_parser():
    """The argument parser; --help explains every flag."""
    parser = OneLineParser(
        prog="prepro.py",
        description="Build a data directory (cleaned splits, one joint sentencepiece BPE model "
                    "with <pad>=0 <unk>=1 <s>=2 </s>=3, BPE-segmented splits, %s) from a parallel "
                    "corpus. Side 1 is the source, side 2 the target; 'eval' is the dev split."
                    % MANIFEST_NAME,
        epilog="Training pairs with an empty side are always dropped; repeated pairs and pairs "
               "whose sides differ in length by more than --max_ratio are only reported unless "
               "--dedup / --filter_ratio is given. Dev and test are never filtered. If a download "
               "fails, pass local copies with --dataset files.")
    parser.add_argument("--dataset", choices=DATASETS, default="numbers",
                        help="numbers: built-in synthetic German->English numbers and dates "
                             "(offline, default); multi30k: Multi30k task 1 de-en (train / val / "
                             "test_2016_flickr), downloaded; iwslt2016: IWSLT 2016 de-en TED talks "
                             "(dev tst2013, test tst2014), downloaded; files: local plain-text "
                             "files given by --train1 ... --test2")
    parser.add_argument("--data_dir", help="output directory (default data/DATASET)")
    parser.add_argument("--vocab_size", type=int,
                        help="BPE vocabulary size including the 4 special pieces (default 1000 for "
                             "numbers, 32000 otherwise); it is an error if the corpus "
                             "cannot fill it")
    parser.add_argument("--bpe_model", metavar="PATH",
                        help="segment with this sentencepiece model (another data dir's bpe.model) "
                             "instead of training one: the data dir gets that vocabulary, so a "
                             "model trained on the other data dir can go on training here "
                             "(train.py --init_from); --vocab_size is the model's")
    parser.add_argument("--dedup", action="store_true",
                        help="drop repeated (source, target) training pairs, keeping the first "
                             "(default: count and report them only)")
    parser.add_argument("--max_ratio", type=float, default=DEFAULT_MAX_RATIO,
                        help="a pair whose longer side has more than this many times the BPE "
                             "pieces of the shorter side counts as a length-ratio "
                             "outlier (default %(default)g)")
    parser.add_argument("--filter_ratio", action="store_true",
                        help="drop length-ratio outliers from train (default: report them only)")
    parser.add_argument("--reverse", action="store_true",
                        help="swap the corpus's sides, to train the other direction: side 1 "
                             "becomes the target language's text (English for numbers and "
                             "multi30k), side 2 the source's, and the manifest's src_lang / "
                             "tgt_lang swap with them")
    parser.add_argument("--force", action="store_true",
                        help="rebuild --data_dir even if it holds a build with other "
                             "inputs or options")
    numbers = parser.add_argument_group("--dataset numbers")
    numbers.add_argument("--seed", type=int, help="random seed of the generated corpus (default 1)")
    numbers.add_argument("--n_train", type=int, help="training pairs (default 50000)")
    numbers.add_argument("--n_eval", type=int, help="dev pairs (default 1000)")
    numbers.add_argument("--n_test", type=int, help="test pairs (default 1000)")
    downloads = parser.add_argument_group(
        "--dataset multi30k / iwslt2016 (downloads, cached in DATA_DIR/download)")
    downloads.add_argument("--url",
                           help=f"multi30k: base URL holding train.de.gz ... "
                                f"test_2016_flickr.en.gz (default {MULTI30K_URL}); iwslt2016: URL "
                                f"of de-en.tgz (default {IWSLT2016_URL}, which no longer answers, "
                                "so give a mirror)")
    downloads.add_argument("--no_verify", action="store_true",
                           help="multi30k: accept files whose sha256 differs from the known "
                                "release (the sha256 of every download is recorded in the manifest "
                                "either way)")
    files = parser.add_argument_group("--dataset files (all six required)")
    for flag in FILE_FLAGS.values():
        split, side = flag[:-1], flag[-1]
        files.add_argument(f"--{flag}", metavar="FILE",
                           help=f"{split} split, {'source' if side == '1' else 'target'} side "
                                "(UTF-8, one sentence per line)")
    files.add_argument("--src_lang", help="language code of the side 1 files, the source "
                                          "(default de; with --reverse it becomes the target)")
    files.add_argument("--tgt_lang", help="language code of the side 2 files, the target "
                                          "(default en; with --reverse it becomes the source)")
    return parser


def check_flags(parser, args):
    """Reject flags meant for another dataset and missing --dataset files inputs."""
    for dataset, flags in DATASET_FLAGS.items():
        if dataset == args.dataset:
            continue
        given = [f"--{flag}" for flag in flags if getattr(args, flag) not in (None, False)
                 and flag not in DATASET_FLAGS[args.dataset]]
        if given:
            parser.error(f"{', '.join(given)}: only for --dataset {dataset}")
    if args.dataset == "files":
        missing = [f"--{flag}" for flag in FILE_FLAGS.values() if getattr(args, flag) is None]
        if missing:
            parser.error(f"--dataset files needs {', '.join(missing)}")
    if args.vocab_size is not None and args.bpe_model:
        parser.error(f"--vocab_size comes from --bpe_model {args.bpe_model}: "
                     "leave --vocab_size out")
    if args.vocab_size is not None and args.vocab_size <= len(SPECIAL_PIECES):
        parser.error(f"--vocab_size {args.vocab_size} is too small: the {len(SPECIAL_PIECES)} "
                     "special pieces (<pad> <unk> <s> </s>) come on top of one piece per character "
                     "of the corpus")
    # sentencepiece reads the size as a 32-bit integer, as the graphs read every count
    if args.vocab_size is not None and args.vocab_size > LARGEST:
        parser.error(f"--vocab_size {shown_number(args.vocab_size)} is out of range: it must be at "
                     f"most {LARGEST} (sentencepiece's limit)")
    if not (math.isfinite(args.max_ratio) and args.max_ratio > 1):
        parser.error(f"--max_ratio {args.max_ratio} is out of range: "
                     "it must be a finite number greater than 1")
    if args.seed is not None and not 0 <= args.seed < 2 ** 32:
        parser.error(f"--seed {args.seed} is out of range: "
                     "it must be from 0 to 2^32 - 1 (4294967295)")


def build_options(args, bpe_model=None):
    """Every option that shapes the output, with defaults filled in. bpe_model: the sentencepiece
    model of --bpe_model (databuild.BpeModel), whose size and sha256 it records."""
    def given_or(value, default):
        return default if value is None else value

    vocab_size = bpe_model.size if bpe_model else given_or(args.vocab_size,
                                                           DEFAULT_VOCAB_SIZE[args.dataset])
    langs = tuple(given_or(getattr(args, key), default) for key,
                  default in DEFAULT_LANGUAGES.items())
    src_lang, tgt_lang = langs[::-1] if args.reverse else langs
    options = {"dataset": args.dataset, "vocab_size": vocab_size,
               "dedup": args.dedup, "filter_ratio": args.filter_ratio, "max_ratio": args.max_ratio,
               "src_lang": src_lang, "tgt_lang": tgt_lang}
    if args.reverse:  # recorded only when given: data dirs built before the flag stay up to date
        options.update(reverse=True)
    if bpe_model:
        options.update(bpe_model_sha256=bpe_model.sha256)
    if args.dataset == "numbers":
        options.update(seed=given_or(args.seed, 1), n_train=given_or(args.n_train, 50000),
                       n_eval=given_or(args.n_eval, 1000), n_test=given_or(args.n_test, 1000))
    return options


def load_corpus(args, options, data_dir):
    """(splits, sources, downloads) for the chosen dataset."""
    if args.dataset == "numbers":
        log(f"generating the numbers corpus (seed {options['seed']})")
        splits = numbers_corpus(options["n_train"], options["n_eval"], options["n_test"],
                                options["seed"])
        return splits, {flag: f"numbers corpus, seed {options['seed']}" for flag
                        in FILE_FLAGS.values()}, []
    if args.dataset == "files":
        splits, sources = file_splits({flag: getattr(args, flag) for flag in FILE_FLAGS.values()})
        return splits, sources, []
    download_dir = Path(data_dir) / "download"
    if args.dataset == "multi30k":
        return multi30k_splits(download_dir, args.url or MULTI30K_URL, verify=not args.no_verify)
    return iwslt2016_splits(download_dir, args.url or IWSLT2016_URL)


def main(argv=None):
    """Run prepro with command-line arguments ``argv``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.data_dir == "":
        parser.error("--data_dir is empty: pass a path, or leave the flag out")
    data_dir = Path(args.data_dir or Path("data") / args.dataset)
    started = time.monotonic()
    try:
        bpe_model = read_bpe_model(args.bpe_model) if args.bpe_model else None
        options = build_options(args, bpe_model)
        check_data_dir(data_dir)
        check_not_owned(data_dir, "data_dir", {HPARAMS_NAME: "a logdir written by train.py"})
        check_inputs_kept(data_dir, {flag: getattr(args, flag) for flag in FILE_FLAGS.values()})
        check_build_owned(data_dir)
        # before a download or a build, which a read-only one would waste
        check_writable_dir(data_dir, "data_dir")
        splits, sources, downloads = load_corpus(args, options, data_dir)
        if args.reverse:
            splits, sources = reversed_corpus(splits, sources)
        manifest = build_data_dir(data_dir, splits, options, sources, downloads, force=args.force,
                                  bpe_model=bpe_model)
    # prepro.py's main returns its exit code: errors.run_cli's lines
    except (UserError, OSError) as error:
        line = error_line(error)
        if line is None:
            raise
        report(line)
        return USER_ERROR_EXIT_CODE
    except KeyboardInterrupt as interrupt:
        print(f"prepro.py: interrupted; {data_dir} has no new manifest, run again to finish",
              file=sys.stderr)
        return interrupted_exit_code(interrupt)
    counts = ", ".join(f"{split} {manifest['splits'][split]['lines']}" for split in SPLITS)
    log(f"done: {data_dir} ({manifest['dataset']}, vocab {manifest['vocab_size']}, {counts} pairs) "
        f"in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    run_cli(main)
