"""Every hyperparameter of the toolkit as an argparse flag.

Hyperparameters flow one way: argparse -> namespace -> `hparams.json` in the logdir (written by train.py)
-> restored namespace (test.py, translate.py and every later tool read the model's shape from there).

    hp = Hparams().parser.parse_args(["--data_dir", "data/numbers"])
"""
import argparse


class Hparams:
    """Holds `parser`, the argparse parser with every flag of train.py and test.py."""

    def __init__(self):
        parser = argparse.ArgumentParser(
            description="Transformer NMT (TF1 graph mode on TensorFlow 2). Source is side 1, target side 2.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        self._add_data(parser.add_argument_group("data"))
        self._add_model(parser.add_argument_group("model"))
        self._add_training(parser.add_argument_group("training"))
        self._add_decoding(parser.add_argument_group("decoding"))
        self._add_testing(parser.add_argument_group("testing"))
        self.parser = parser

    @staticmethod
    def _add_data(group):
        group.add_argument("--data_dir", default="data/numbers",
                           help="directory written by prepro.py (manifest.json, bpe.model, *.bpe splits)")
        group.add_argument("--logdir", default="runs/numbers",
                           help="where checkpoints, hparams.json, summaries and dev hypotheses go")
        group.add_argument("--maxlen1", type=int, default=100,
                           help="longest training source in BPE pieces (with </s>); longer pairs are skipped")
        group.add_argument("--maxlen2", type=int, default=100,
                           help="longest training target in BPE pieces (with </s>); longer pairs are skipped")
        group.add_argument("--truncate", action="store_true",
                           help="truncate over-long training pairs to maxlen1/maxlen2 instead of skipping them")

    @staticmethod
    def _add_model(group):
        group.add_argument("--d_model", type=int, default=256, help="hidden size of every layer")
        group.add_argument("--d_ff", type=int, default=1024, help="inner size of the position-wise feed-forward")
        group.add_argument("--num_blocks", type=int, default=3, help="encoder blocks (and as many decoder blocks)")
        group.add_argument("--num_heads", type=int, default=8, help="attention heads; must divide d_model")
        group.add_argument("--dropout_rate", type=float, default=0.1, help="dropout on embeddings and sublayers")
        group.add_argument("--norm_type", choices=["post", "pre"], default="post",
                           help="post: LN(x + f(x)) as in the paper; pre: x + f(LN(x)), steadier when deep")

    @staticmethod
    def _add_training(group):
        group.add_argument("--batch_type", choices=["tokens", "sentences"], default="tokens",
                           help="tokens: length-bucketed batches of at most batch_size tokens (padding "
                                "included); sentences: batch_size sentences per batch")
        group.add_argument("--batch_size", type=int, default=4096,
                           help="tokens per batch (batch_type tokens) or sentences per batch")
        group.add_argument("--bucket_growth", type=float, default=0.05,
                           help="batch_type tokens: each bucket's padded width is this fraction wider than the "
                                "last, once that exceeds one token (0.05: widths 1 to 20, then 21, 23, 25, ...); "
                                "more growth means fewer batch shapes (less memory) but more padding")
        group.add_argument("--num_epochs", type=int, default=20, help="epochs to train")
        group.add_argument("--max_steps", type=int, default=0,
                           help="stop (with a checkpoint) at this global step; 0 means no limit")
        group.add_argument("--max_minutes", type=float, default=0,
                           help="stop (with dev BLEU and a checkpoint) after this many minutes of training in this "
                                "run; 0 means no limit")
        group.add_argument("--lr", type=float, default=1e-3,
                           help="peak learning rate, reached at the end of warm-up (every schedule)")
        group.add_argument("--lr_schedule", choices=["linear", "cosine", "noam"], default="linear",
                           help="linear / cosine: linear warm-up, then decay to 0 at the end of the training budget "
                                "(--max_steps, --num_epochs, or the steps that --max_minutes allows, fixed from "
                                "the step rate measured during warm-up and saved in the checkpoint); noam "
                                "(Section 5.3): lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5), no end")
        group.add_argument("--warmup_steps", type=int, default=1000, help="learning-rate warm-up steps")
        group.add_argument("--smoothing", type=float, default=0.1, help="label smoothing epsilon")
        group.add_argument("--seed", type=int, default=1234, help="graph-level random seed and shuffling seed")
        group.add_argument("--keep_checkpoints", type=int, default=5, help="how many checkpoints to keep")
        group.add_argument("--eval_every", type=int, default=1,
                           help="translate the dev set and compute BLEU every this many epochs, and at the end; "
                                "0: at the end only (what a time budget wants: each dev decode costs training time)")
        group.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                           help="auto: fp16 with a GPU, bf16 on a CPU with avx512_bf16 or amx_bf16 (unless "
                                "ONEDNN_MAX_CPU_ISA caps it), else fp32; bf16: matrix products in bfloat16 (slower "
                                "than fp32 on CPUs without those flags); fp16: in float16 with dynamic loss scaling "
                                "(GPUs with tensor cores); variables, layer norm, softmax and loss stay fp32")
        group.add_argument("--distribute", choices=["none", "mirrored", "multiworker"], default="none",
                           help="none: one device; mirrored: the devices of --devices in this process; multiworker: "
                                "one process per worker, cluster and task from TF_CONFIG (see docs/distributed.md). "
                                "--batch_size is the global batch, split over all replicas")
        group.add_argument("--devices", default="",
                           help="with --distribute mirrored: comma-separated devices, e.g. /gpu:0,/gpu:1 (default "
                                "every GPU) or /cpu:0,/cpu:1 to try it on a CPU")
        group.add_argument("--threads", type=int, default=0,
                           help="intra-op threads for the session; 0 uses every core")

    @staticmethod
    def _add_decoding(group):
        group.add_argument("--beam_size", type=int, default=1, help="beam width; 1 is greedy decoding")
        group.add_argument("--alpha", type=float, default=0.6,
                           help="beam search length penalty ((5+len)/6)^alpha; 0 ranks by log-probability")
        group.add_argument("--max_len_a", type=float, default=1.5,
                           help="decode at most max_len_a * source_length + max_len_b steps per sentence")
        group.add_argument("--max_len_b", type=int, default=10, help="see --max_len_a")

    @staticmethod
    def _add_testing(group):
        group.add_argument("--ckpt", default="", help="checkpoint to test; default the latest in --logdir")
        group.add_argument("--testdir", default="",
                           help="where test.py writes hypotheses and results.json; default LOGDIR/test")
        group.add_argument("--test_batch_size", type=int, default=128, help="sentences per decoding batch")


def explicit_flags(argv):
    """The flags given on the command line argv (not their defaults), as a dict."""
    parser = Hparams().parser
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


#: What flags added after the first release meant before they existed: a logdir whose hparams.json lacks one was
#: trained with this value (not the flag's current default).
LEGACY_VALUES = {"lr_schedule": "noam", "precision": "fp32"}

#: Flags that fix the shape of the graph and its variables: restored from hparams.json, never from the command line.
MODEL_FLAGS = ("d_model", "d_ff", "num_blocks", "num_heads", "norm_type", "vocab_size")
