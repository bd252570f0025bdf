"""PNG heat maps of the attention of a trained model's translations, and of the positional encoding.

    python plot_attention.py --logdir runs/numbers --dir plots "Er zählt bis elf." \\
        ["another sentence" ...]

draws DIR/positional_encoding.png and, per sentence, DIR/NNNN.png with the cross-attention heads of
the last decoder block, and prints the translations: translate.py --plot_attention DIR with the
sentences given. The heat maps are drawn by toolkit/translating/attention_plots.py.
"""
from toolkit.base.cli import OneLineParser, run_cli
from toolkit.base.writing import check_writable_dir


def main(argv=None):
    """The command line: translate.py --plot_attention DIR for the sentences given (see
    the module docstring)."""
    parser = OneLineParser(prog="plot_attention.py",
                           description="Translate sentences with a trained model and draw the "
                                       "cross-attention heads of its last decoder block as PNGs "
                                       "(translate.py --plot_attention).")
    parser.add_argument("--logdir", required=True, help="a logdir written by train.py")
    parser.add_argument("--dir", required=True,
                        help="where the PNGs go: positional_encoding.png and NNNN.png, NNNN the "
                             "sentence's number counted from 1")
    parser.add_argument("--ckpt", default="",
                        help="checkpoint to use; default the latest in --logdir")
    parser.add_argument("sentences", nargs="+", metavar="SENTENCE",
                        help="sentences to translate and draw")
    args = parser.parse_args(argv)
    check_writable_dir(args.dir, "dir")
    import translate  # TensorFlow only once the command line is known to be good
    from toolkit.base import runtime
    from toolkit.translating.attention_plots import check_plot_dir
    from toolkit.translating.trained_model import read_dirs, trained_hparams
    runtime.start_graph_mode()  # before anything of TensorFlow's runs
    check_plot_dir(args.dir, "dir", {}, read_dirs(trained_hparams(args.logdir, {}), args.ckpt))
    return translate.main(["--logdir", args.logdir, "--plot_attention", args.dir]
                          + (["--ckpt", args.ckpt] if args.ckpt else []) + ["--"] + args.sentences)


if __name__ == "__main__":
    run_cli(main)
