"""Every hyperparameter of the toolkit as an argparse flag.

Hyperparameters flow one way: argparse -> namespace -> `hparams.json` in the logdir (written by
train.py) -> restored namespace (test.py, translate.py and every later tool read the model's shape
from there).

    hp = Hparams().parser.parse_args(["--data_dir", "data/numbers"])
"""
import argparse
import json

from toolkit.data.datadir import MANIFEST_NAME
from toolkit.base.cli import OneLineParser
from toolkit.base.errors import UserError
from toolkit.base.reading import is_finite_number, shown_number, type_problem

#: The flags of the tools that decode with a trained model (test.py adds --testdir, translate.py its
#: own flags): where the model and data are, how to decode, and how to run. Everything else comes
#: from LOGDIR/hparams.json.
#: The options of decoding.DecodingSettings beyond beam search and its limits, with --ensemble:
#: flags of the tools that decode (not of train.py), off at their defaults.
DECODING_OPTIONS = ("ensemble", "min_len_a", "min_len_b", "sampling_topk", "sampling_topp",
                    "sampling_temperature", "no_repeat_ngram_size", "repetition_penalty",
                    "min_confidence")
DECODING_FLAGS = ("logdir", "data_dir", "ckpt", "test_batch_size", "beam_size", "alpha",
                  "max_len_a", "max_len_b", "threads", "precision", "impl",
                  "seed") + DECODING_OPTIONS
#: The model's defaults, stated once: its flags below take them, and so does model.ModelConfig.
MODEL_DEFAULTS = {"d_model": 256, "d_ff": 1024, "num_blocks": 3, "num_heads": 8,
                  "dropout_rate": 0.1, "relu_dropout": 0.0, "norm_type": "post", "smoothing": 0.1,
                  "impl": "fast"}
#: The file in a logdir that holds the flags of the model trained there (train.py writes it).
HPARAMS_NAME = "hparams.json"

#: What a tool that reads a trained model says about a flag it does not take.
TRAINED_FLAGS_HINT = "; the model's shape and training flags come from LOGDIR/hparams.json"


class _Only:
    """An argument group that adds only the flags in `only` (every flag when only is None)."""

    def __init__(self, group, only):
        self.group, self.only = group, only

    def add_argument(self, flag, **kwargs):
        if self.only is None or flag[2:] in self.only:
            self.group.add_argument(flag, **kwargs)


class Hparams:
    """Holds `parser`, the argparse parser with every flag of train.py, or with the flags in `only`
    (a tool that reads the rest from hparams.json)."""

    def __init__(self, only=None, prog=None, description=None):
        parser = OneLineParser(
            prog=prog,
            description=description or (
                "Transformer NMT (TF1 graph mode on TensorFlow 2). Source is side 1, target side 2."
                + (" A flag not given keeps its value in LOGDIR/hparams.json." if only else "")),
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
            unrecognized_hint=TRAINED_FLAGS_HINT if only else "")
        self._add_data(_Only(parser.add_argument_group("data"), only))
        self._add_model(_Only(parser.add_argument_group("model"), only))
        self._add_training(_Only(parser.add_argument_group("training"), only))
        self._add_decoding(_Only(parser.add_argument_group("decoding"), only))
        if only is not None:
            self._add_decoding_options(_Only(parser.add_argument_group(
                "decoding options (see docs/decoding.md)"), only))
        self._add_testing(_Only(parser.add_argument_group("testing"), only))
        self.parser = parser

    @staticmethod
    def _add_data(group):
        group.add_argument("--data_dir", default="data/numbers",
                           help="directory written by prepro.py (%s, bpe.model, *.bpe splits)"
                           % MANIFEST_NAME)
        group.add_argument("--logdir", default="runs/numbers",
                           help="where checkpoints, hparams.json, summaries and dev hypotheses go")
        group.add_argument("--maxlen1", type=int, default=100,
                           help="longest training source in BPE pieces (with </s>); longer pairs "
                                "are skipped")
        group.add_argument("--maxlen2", type=int, default=100,
                           help="longest training target in BPE pieces (with </s>); longer pairs "
                                "are skipped")
        group.add_argument("--truncate", action="store_true",
                           help="truncate over-long training pairs to maxlen1/maxlen2 instead of "
                                "skipping them")
        group.add_argument("--bpe_dropout", type=float, default=0.0,
                           help="segment the training text anew each epoch with BPE-dropout at "
                                "this rate (Provilkov et al., 2020: at each merge step each "
                                "possible merge is dropped with this probability, so words come in "
                                "varying, finer pieces; a regulariser; it lengthens the sequences, "
                                "by about 21%% at 0.1 on Multi30k, and did not pay in the recipe's "
                                "runs, docs/log/recipe-log.md); 0: prepro's segmentation. Dev, "
                                "test and translation always use prepro's")

    @staticmethod
    def _add_model(group):
        group.add_argument("--d_model", type=int, default=MODEL_DEFAULTS["d_model"],
                           help="hidden size of every layer")
        group.add_argument("--d_ff", type=int, default=MODEL_DEFAULTS["d_ff"],
                           help="inner size of the position-wise feed-forward")
        group.add_argument("--num_blocks", type=int, default=MODEL_DEFAULTS["num_blocks"],
                           help="encoder blocks (and as many decoder blocks)")
        group.add_argument("--num_heads", type=int, default=MODEL_DEFAULTS["num_heads"],
                           help="attention heads; must divide d_model")
        group.add_argument("--dropout_rate", type=float, default=MODEL_DEFAULTS["dropout_rate"],
                           help="dropout on embeddings and sublayers")
        group.add_argument("--attention_dropout", type=float, default=None,
                           help="dropout on the attention weights (softmax outputs); "
                                "default: --dropout_rate")
        group.add_argument("--relu_dropout", type=float, default=MODEL_DEFAULTS["relu_dropout"],
                           help="dropout on the feed-forward sublayers' inner ReLU activations "
                                "(the paper has none)")
        group.add_argument("--norm_type", choices=["post", "pre"],
                           default=MODEL_DEFAULTS["norm_type"],
                           help="post: LN(x + f(x)) as in the paper; pre: x + f(LN(x)), "
                                "steadier when deep")
        group.add_argument("--impl", choices=["fast", "reference"], default=MODEL_DEFAULTS["impl"],
                           help="fast: fused products, custom gradients, mixed precision and "
                                "(--kernels) C++ kernels (fast/); reference: modules.py's plain "
                                "TensorFlow ops in float32, the paper as written, slower. The same "
                                "variables: checkpoints move between the two, and test.py, "
                                "translate.py and export.py may choose another than training did")

    @staticmethod
    def _add_training(group):
        group.add_argument("--batch_type", choices=["tokens", "sentences"], default="tokens",
                           help="tokens: length-bucketed batches of at most batch_size tokens "
                                "(padding included); sentences: batch_size sentences per batch")
        group.add_argument("--batch_size", type=int, default=4096,
                           help="tokens per batch (batch_type tokens) or sentences per batch")
        group.add_argument("--accum_steps", type=int, default=1,
                           help="batches per optimizer step: their gradients are summed and "
                                "divided by all their target tokens, so that N batches make the "
                                "update of one N times larger (gradient accumulation); steps, "
                                "--max_steps, --warmup_steps and the summaries count updates")
        group.add_argument("--bucket_growth", type=float, default=0.05,
                           help="batch_type tokens: each bucket's padded width is this fraction "
                                "wider than the last, once that exceeds one token (0.05: widths 1 "
                                "to 20, then 21, 23, 25, ...); more growth means fewer batch "
                                "shapes (less memory) but more padding")
        group.add_argument("--num_epochs", type=int, default=20, help="epochs to train")
        group.add_argument("--max_steps", type=int, default=0,
                           help="stop (with a checkpoint) at this global step; 0 means no limit")
        group.add_argument("--max_minutes", type=float, default=0,
                           help="stop (with dev BLEU and a checkpoint) after this many minutes of "
                                "training in this run; 0 means no limit")
        group.add_argument("--lr", type=float, default=1e-3,
                           help="peak learning rate, reached at the end of warm-up "
                                "(every schedule)")
        group.add_argument("--lr_schedule", choices=["linear", "cosine", "noam_cooldown", "noam"],
                           default="linear",
                           help="linear / cosine: linear warm-up, then decay to 0 at the end of "
                                "the training budget (--max_steps, --num_epochs, or the steps that "
                                "--max_minutes allows, estimated from the step rate observed after "
                                "warm-up and again as it changes, and saved in the checkpoint); "
                                "noam (Section 5.3): lr * warmup^0.5 * min(step * warmup^-1.5, "
                                "step^-0.5), no end; "
                                "noam_cooldown: noam, then linear decay to 0 over the last "
                                "--cooldown_fraction of the budget")
        group.add_argument("--cooldown_fraction", type=float, default=0.2,
                           help="--lr_schedule noam_cooldown: the fraction of the training budget, "
                                "at its end, over which the rate falls linearly to 0")
        group.add_argument("--warmup_steps", type=int, default=1000,
                           help="learning-rate warm-up steps")
        group.add_argument("--smoothing", type=float, default=MODEL_DEFAULTS["smoothing"],
                           help="label smoothing epsilon")
        group.add_argument("--rdrop", type=float, default=0.0, metavar="ALPHA",
                           help="R-Drop (Liang et al., 2021): each batch runs twice with "
                                "independent dropout masks (one pass of twice the rows: about "
                                "twice the step time) and the loss per target token is the "
                                "paper's halved, (CE1 + CE2 + ALPHA * (KL(p1||p2) + KL(p2||p1)) "
                                "/ 2) / 2, on the scale of a run without it; ALPHA is the "
                                "paper's alpha (it used 5 for translation). Needs dropout to act; "
                                "0: off, the loss as without it")
        group.add_argument("--seed", type=int, default=1234,
                           help="graph-level random seed and shuffling seed")
        group.add_argument("--keep_checkpoints", type=int, default=5,
                           help="how many checkpoints to keep; the best by dev BLEU is kept "
                                "besides, as best-STEP (LOGDIR/best.json names it; --ckpt best "
                                "takes it)")
        group.add_argument("--patience", type=int, default=0,
                           help="stop after this many dev evaluations in a row without a better "
                                "dev BLEU (a resumed run goes on counting); 0: never stop early")
        group.add_argument("--init_from", default="", metavar="LOGDIR_OR_CHECKPOINT",
                           help="start a new logdir from the weights of another run (its latest "
                                "checkpoint, or the one named) with a fresh optimizer and schedule "
                                "from step 0; the data dir must have its vocabulary (prepro.py "
                                "--bpe_model) and model-shape flags not given "
                                "default to its hparams.json")
        group.add_argument("--suggestions", default="", metavar="DB",
                           help="with --init_from RUN: fine-tune on what users corrected, the "
                                "suggestions (not rejected) in this SQLite database of serve.py's "
                                "for RUN's direction: a data dir is built in "
                                "LOGDIR/corrections_data (train: the suggestions not held out and "
                                "--replay_ratio's pairs of RUN's training split; dev: RUN's dev "
                                "split; test: the held-out suggestions), and after training the "
                                "dev and held-out BLEU of RUN's checkpoint and of the last one are "
                                "compared: the logdir is kept if the held-out BLEU rises and dev "
                                "falls by at most --max_dev_drop, else marked rejected "
                                "(LOGDIR/REJECTED.json, which the tools refuse) with exit code 3 "
                                "(docs/corrections.md)")
        group.add_argument("--suggestions_heldout", type=float, default=0.2, metavar="F",
                           help="with --suggestions: the fraction of the suggestion pairs held "
                                "out (chosen under --seed; the pairs of one source text stay "
                                "together) to judge the fine-tune by; at least one pair is held "
                                "out and one trained on")
        group.add_argument("--replay_ratio", type=float, default=4.0, metavar="R",
                           help="with --suggestions: pairs of RUN's training split (sampled under "
                                "--seed) trained on per suggestion pair, so that the model does "
                                "not forget what it knew; 0: none")
        group.add_argument("--max_dev_drop", type=float, default=0.5, metavar="B",
                           help="with --suggestions: the most dev BLEU may fall from RUN's "
                                "checkpoint to the fine-tuned one for the fine-tune to be kept")
        group.add_argument("--config", default="", metavar="FILE",
                           help="take flags from a JSON file: another run's hparams.json or an "
                                "object of flag values; flags on the command line override it, and "
                                "--logdir is never taken from it")
        group.add_argument("--eval_every", type=int, default=1,
                           help="translate the dev set and compute BLEU every this many epochs, "
                                "and at the end; 0: at the end only (what a time budget wants: "
                                "each dev decode costs training time)")
        group.add_argument("--summary_every", type=int, default=100,
                           help="write the TensorBoard training summaries (loss, lr, grad_norm, an "
                                "attention image) every this many steps; each costs an extra "
                                "all-reduce with --distribute")
        group.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                           help="auto: fp16 with a GPU, bf16 on a CPU with avx512_bf16 or amx_bf16 "
                                "(unless ONEDNN_MAX_CPU_ISA caps it), else fp32; bf16: matrix "
                                "products in bfloat16 (slower than fp32 on CPUs without those "
                                "flags); fp16: in float16 with dynamic loss scaling (GPUs with "
                                "tensor cores); variables, layer norm, softmax and loss stay fp32")
        group.add_argument("--kernels", choices=["auto", "fused", "tf"], default="auto",
                           help="auto: in training, each attention's scaling, masks, softmax and "
                                "dropout, and each post-norm sublayer's dropout, residual add and "
                                "layer norm, run as one C++ kernel each, their gradients too "
                                "(fast/kernels.py, built with g++ on first use), when they build "
                                "here and no GPU is visible, else as TensorFlow's ops; the same "
                                "functions (their dropout draws its own decisions); fused: what "
                                "auto resolved to (a resumed run checks again); tf: TensorFlow's "
                                "ops only. --impl fast only (reference: tf)")
        group.add_argument("--distribute", choices=["none", "mirrored", "multiworker"],
                           default="none",
                           help="none: one device; mirrored: the devices of --devices in this "
                                "process; multiworker: one process per worker, cluster and task "
                                "from TF_CONFIG (see docs/distributed.md). --batch_size is the "
                                "global batch, split over all replicas")
        group.add_argument("--devices", default="",
                           help="with --distribute mirrored: comma-separated devices, e.g. "
                                "/gpu:0,/gpu:1 (default every GPU) or /cpu:0,/cpu:1 to try it on "
                                "a CPU")
        group.add_argument("--threads", type=int, default=0,
                           help="threads for each op's kernel (intra-op) and for running "
                                "independent ops side by side (inter-op); 0 uses every core this "
                                "process may run on (with --engine ctranslate2: one thread per "
                                "batch, its fastest on small machines)")

    @staticmethod
    def _add_decoding(group):
        group.add_argument("--beam_size", type=int, default=1,
                           help="beam width; 1 is greedy decoding")
        group.add_argument("--alpha", type=float, default=0.6,
                           help="beam search length penalty ((5+len)/6)^alpha; 0 ranks "
                                "by log-probability")
        group.add_argument("--max_len_a", type=float, default=1.5,
                           help="decode at most max_len_a * source_length + max_len_b steps "
                                "per sentence")
        group.add_argument("--max_len_b", type=int, default=10, help="see --max_len_a")

    @staticmethod
    def _add_decoding_options(group):
        group.add_argument("--ensemble", nargs="+", default=[], metavar="LOGDIR_OR_CKPT",
                           help="more models decoded with --logdir's, by the mean of their "
                                "log-probabilities at each step: logdirs (their latest "
                                "checkpoint) or checkpoints, of the same bpe.model")
        group.add_argument("--min_len_a", type=float, default=0.0,
                           help="output at least min_len_a * source length + min_len_b tokens "
                                "before </s>")
        group.add_argument("--min_len_b", type=int, default=0, help="see --min_len_a")
        group.add_argument("--sampling_topk", type=int, default=1, metavar="K",
                           help="draw each token from the K most probable (0: from every "
                                "token; 1: no sampling, take the most probable); needs "
                                "--beam_size 1, and --nbest N draws N samples")
        group.add_argument("--sampling_topp", type=float, default=1.0, metavar="P",
                           help="when sampling, draw each token from the fewest most probable "
                                "tokens whose probability adds up to P (1: no limit)")
        group.add_argument("--sampling_temperature", type=float, default=1.0, metavar="T",
                           help="when sampling, draw from the probabilities to the power 1/T: "
                                "below 1 sharper, above 1 flatter")
        group.add_argument("--no_repeat_ngram_size", type=int, default=0, metavar="N",
                           help="never output an n-gram of N tokens twice (0: off)")
        group.add_argument("--repetition_penalty", type=float, default=1.0, metavar="R",
                           help="divide the positive logits of tokens already output by R and "
                                "multiply their negative ones by it (1: off)")
        group.add_argument("--min_confidence", type=float, default=0.0, metavar="C",
                           help="print an empty translation when its confidence, the geometric "
                                "mean of its tokens' probabilities, is below C (0: never)")

    @staticmethod
    def _add_testing(group):
        group.add_argument("--ckpt", default="",
                           help="checkpoint to test; default the latest in --logdir; best: the "
                                "best by dev BLEU (LOGDIR/best.json)")
        group.add_argument("--testdir", default="",
                           help="where test.py writes hypotheses and results.json; "
                                "default LOGDIR/test")
        group.add_argument("--test_batch_size", type=int, default=128,
                           help="sentences per decoding batch")


def add_decoding_options(group, only):
    """Adds the decoding options named in `only` (of DECODING_OPTIONS) to an argument group of
    another parser (export.py's), with the help and defaults the decoding tools give them."""
    Hparams._add_decoding_options(_Only(group, only))


class ResolvedHparams(argparse.Namespace):
    """Flags once they are resolved (resolved()): read-only, so that every part of a run sees the
    values it was started with."""

    def __setattr__(self, name, value):
        raise AttributeError("--%s is resolved once, before anything is built; it can not change "
                             "to %r" % (name, value))


def resolved(hp, **values):
    """hp (a Namespace of flags) with values put in, read-only from then on (ResolvedHparams)."""
    frozen = ResolvedHparams()
    vars(frozen).update({**vars(hp), **values})
    return frozen


class _NotGiven:
    """The value of every flag before parsing, in parse_flags: a flag that keeps it was not on the
    command line."""


#: The flags of the tools that name a file or directory to read or write: given, they may not be
#: empty ("" would be the working directory to some calls, no path to others).
PATH_FLAGS = ("logdir", "data_dir", "testdir", "config", "input", "output", "score",
              "plot_attention", "model", "suggestions")


def parse_flags(parser, argv, intermixed=False):
    """Parses argv with parser (parse_intermixed_args if intermixed). Returns the namespace of every
    flag, and the flags given on the command line (not defaulted) as a dict. --help and unknown or
    invalid flags are handled by the parser, with the defaults that --help shows; a PATH_FLAGS flag
    given empty is a UserError."""
    parse = parser.parse_intermixed_args if intermixed else parser.parse_args
    args = parse(argv)
    # argparse keeps what a namespace has
    unset = argparse.Namespace(**{name: _NotGiven for name in vars(args)})
    given = {name: value for name, value in vars(parse(argv, namespace=unset)).items()
             if value is not _NotGiven}
    empty = [flag for flag in PATH_FLAGS if given.get(flag) == ""]
    if empty:
        raise UserError("--%s is empty: pass a path, or leave the flag out" % empty[0])
    return args, given


#: What flags added after the first release meant before they existed: a logdir whose hparams.json
#: lacks one was trained with this value (not the flag's current default).
#: vocab_sha256, bpe_sha256, src_lang and tgt_lang (not flags: train.py records the data dir's,
#: datadir.fingerprint) None: unknown, not compared (the vocabulary's size still is, and a data
#: dir's bpe.model must match its bpe.vocab).
LEGACY_VALUES = {"lr_schedule": "noam", "precision": "fp32", "kernels": "tf", "impl": "fast",
                 "vocab_sha256": None, "bpe_sha256": None, "src_lang": None, "tgt_lang": None}

#: Flags that fix the shape of the graph and its variables: restored from hparams.json, never from
#: the command line.
MODEL_FLAGS = ("d_model", "d_ff", "num_blocks", "num_heads", "norm_type", "vocab_size")


#: The largest value of a count (steps, sizes, lengths, a beam): TensorFlow's int32. Every count
#: of the graph fits one; a larger one would overflow where it is used, so no range goes past it.
LARGEST = 2 ** 31 - 1


def at_least(low):
    """A RANGES entry: values of low or more, up to LARGEST."""
    return lambda value: low <= value <= LARGEST, "at least %g and at most %d" % (low, LARGEST)


def in_range(low, high, what):
    """A RANGES entry: values from low up to, not including, high; `what` says so to the user."""
    return lambda value: low <= value < high, what


#: The range of every numeric flag: flag -> (test of a value, what the value must be).
RANGES = {
    "maxlen1": at_least(2), "maxlen2": at_least(2),  # one piece and </s>
    "bpe_dropout": in_range(0, 1, "at least 0 and below 1"),
    "d_model": at_least(1), "d_ff": at_least(1), "num_blocks": at_least(1),
    "num_heads": at_least(1),
    # dropout draws are 16-bit: a rate within 2^-17 of 1 would round to dropping everything
    "dropout_rate": in_range(0, 1 - 2 ** -17, "at least 0 and below 1"),
    "attention_dropout": in_range(0, 1 - 2 ** -17, "at least 0 and below 1"),
    "relu_dropout": in_range(0, 1 - 2 ** -17, "at least 0 and below 1"),
    "batch_size": at_least(1), "accum_steps": at_least(1), "bucket_growth": at_least(0),
    "num_epochs": at_least(1),
    "max_steps": at_least(0), "max_minutes": at_least(0),
    "lr": (lambda value: value > 0, "above 0"), "warmup_steps": at_least(1),
    "cooldown_fraction": (lambda value: 0 < value <= 1, "above 0 and at most 1"),
    "smoothing": in_range(0, 1, "at least 0 and below 1"), "keep_checkpoints": at_least(1),
    "rdrop": at_least(0),
    "patience": at_least(0), "eval_every": at_least(0), "summary_every": at_least(1),
    "suggestions_heldout": (lambda value: 0 < value < 1, "above 0 and below 1"),
    "replay_ratio": (lambda value: 0 <= value <= 10 ** 4, "from 0 to 10000"),
    "max_dev_drop": (lambda value: 0 <= value <= 100, "from 0 to 100 (BLEU points)"),
    # a session's thread pools: far beyond any machine's cores, and TensorFlow's int32 limit
    "threads": in_range(0, 4097, "from 0 (every core) to 4096"),
    "beam_size": at_least(1), "alpha": at_least(0),
    # a decoding limit of max_len_a * source length + max_len_b steps: far beyond any translation,
    # and within TensorFlow's float32 and int32
    "max_len_a": (lambda value: 0 <= value <= 1000, "from 0 to 1000"),
    "max_len_b": (lambda value: 1 <= value <= 10 ** 6, "from 1 to 1000000"),
     # at least one decoding step, whatever the source length
    "min_len_a": (lambda value: 0 <= value <= 1000, "from 0 to 1000"),
    "min_len_b": (lambda value: 0 <= value <= 10 ** 6, "from 0 to 1000000"),
    "sampling_topk": at_least(0),
    "sampling_topp": (lambda value: 0 < value <= 1, "above 0 and at most 1"),
    "sampling_temperature": (lambda value: 0.01 <= value <= 100, "from 0.01 to 100"),
    # each size is a graph of its own in serve.py
    "no_repeat_ngram_size": (lambda value: 0 <= value <= 16, "from 0 (off) to 16"),
    "repetition_penalty": (lambda value: 0.01 <= value <= 100, "from 0.01 to 100"),
    "min_confidence": (lambda value: 0 <= value <= 1, "from 0 to 1"),
    "test_batch_size": at_least(1), "nbest": at_least(1),
    # numpy's and TensorFlow's seed range
    "seed": in_range(0, 2 ** 32, "from 0 to 2^32 - 1 (4294967295)"),
}


def range_error(hp, flags=None, where=None):
    """The first flag of hp (of `flags`, default every flag) outside its range, or a pair of flags
    that do not go together, as one sentence for the user; None when every value is valid. where:
    the file the values come from (hparams.json), named instead of the command line."""
    values = vars(hp)
    for flag, (valid, must_be) in RANGES.items():
        value = values.get(flag)
        if value is None or (flags is not None and flag not in flags):
            continue
        # any value a user can write: an integer of any size, inf, nan, a string
        if not (is_finite_number(value) and valid(value)):
            shown = shown_number(value)
            if where:
                return "%s: %s is %s, out of range: it must be %s" % (where, flag, shown, must_be)
            return "--%s %s is out of range: it must be %s" % (flag, shown, must_be)
    d_model, num_heads = values.get("d_model"), values.get("num_heads")
    if d_model and num_heads and d_model % num_heads:
        return "--num_heads %d must divide --d_model %d" % (num_heads, d_model)
    shaping = [flag for flag in ("sampling_topp", "sampling_temperature")
               if values.get(flag, 1) != 1]
    if shaping and values.get("sampling_topk", 0) == 1:
        return ("--%s shapes the draws of sampling, which --sampling_topk 1 turns off: give "
                "--sampling_topk K (0: every token) too, or leave it out" % shaping[0])
    if values.get("sampling_topk", 1) != 1 and values.get("beam_size", 1) > 1:
        return ("--sampling_topk samples one hypothesis at a time: it needs --beam_size 1, not %d"
                % values["beam_size"])
    longest = max(values.get("maxlen1", 0), values.get("maxlen2", 0))
    too_small = values.get("batch_size", longest) < longest
    if values.get("batch_type") == "tokens" and too_small and flags is None:
        return ("--batch_size %d tokens cannot hold a pair of --maxlen1 %d / --maxlen2 %d pieces: "
                "raise it to %d, lower --maxlen1/--maxlen2, or pass --batch_type sentences"
                % (values["batch_size"], values["maxlen1"], values["maxlen2"], longest))
    return None


def check_ranges(hp, flags=None):
    """Raises a UserError naming the first flag of hp (of `flags`, default all) outside its range
    (see range_error): checked before anything is built."""
    problem = range_error(hp, flags)
    if problem:
        raise UserError(problem)


#: The types of the values hparams.json holds besides flags (train.py records them
#: from the data dir).
RECORDED_TYPES = {"vocab_size": (int,), "vocab_sha256": (str, type(None)),
                  "bpe_sha256": (str, type(None)), "data_dir": (str,),
                  "src_lang": (str, type(None)), "tgt_lang": (str, type(None))}


def expected_types(action):
    """The Python types a value of an argparse action may have in hparams.json: a float
    flag takes integers."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return (bool,)
    if action.type is float and action.default is None:  # null stands for another flag's value
        return (float, int, type(None))
    return {int: (int,), float: (float, int)}.get(action.type, (str,))


def type_error(saved, fpath):
    """The first value of a hparams.json dict (read from fpath) whose type does not fit its flag (or
    its recorded key, RECORDED_TYPES) or that is not among the flag's choices, as one sentence
    naming the file and the key; None when all fit. Hand edits are where these come from."""
    actions = {action.dest: action for action in Hparams().parser._actions}
    schema = {**RECORDED_TYPES, **{key: expected_types(action) for key, action in actions.items()}}
    problem = type_problem(saved, schema, fpath, "fix it, or restore the file from a copy")
    if problem:
        return problem
    for key, value in saved.items():
        choices = actions[key].choices if key in actions else None
        if choices and value not in choices:
            return ("%s: %s is %s but must be one of %s: fix it, or restore the file from a copy"
                    % (fpath, key, json.dumps(value), ", ".join(choices)))
    return None
