"""PNG heat maps of attention weights and of the positional encoding (used by `translate.py --plot_attention`).

    python plot_attention.py --logdir runs/numbers --dir plots "Er zählt bis elf." ["another sentence" ...]

draws DIR/positional_encoding.png and, per sentence, DIR/NNNN.png with the cross-attention heads of the last
decoder block, and prints the translations: translate.py --plot_attention DIR with the sentences given.

The only module of the toolkit that imports matplotlib (scripts/plot_recipe.py, the recipe's plot, aside); it draws
with the Agg backend, so no display is needed.
"""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from toolkit.errors import OneLineParser, run_cli  # noqa: E402
from toolkit.outputs import atomic_file, check_writable_dir  # noqa: E402

#: Largest number of head panels side by side.
MAX_COLUMNS = 4


def plot_attention_heads(attention, source_pieces, target_pieces, fpath, title=""):
    """One heat map per head, in a grid, saved as a PNG.

    attention: (h, T2, T1) numpy array, weights of target position t over source position s (rows sum to 1).
    source_pieces: T1 labels of the x axis. target_pieces: T2 labels of the y axis.
    """
    num_heads, t2, t1 = attention.shape
    columns = min(num_heads, MAX_COLUMNS)
    rows = math.ceil(num_heads / columns)
    panel_width, panel_height = 1.8 + 0.22 * t1, 1.6 + 0.22 * t2  # inches: one row or column per piece, and labels
    fig, axes = plt.subplots(rows, columns, figsize=(columns * panel_width, rows * panel_height + 0.6),
                             squeeze=False, layout="constrained")
    for head, ax in enumerate(axes.flat):
        if head >= num_heads:
            ax.axis("off")
            continue
        image = ax.imshow(attention[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title("head %d" % (head + 1), fontsize=9)
        ax.set_xticks(range(t1))
        ax.set_xticklabels(source_pieces, rotation=90, fontsize=7)
        ax.set_yticks(range(t2))
        ax.set_yticklabels(target_pieces, fontsize=7)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    fig.suptitle(title or "cross-attention of the last decoder block (rows: target, columns: source)", fontsize=9)
    save(fig, fpath)


def plot_positional_encoding(encoding, fpath):
    """encoding: (T, d_model) numpy array of the sinusoidal positional encoding. Saves it as a PNG heat map."""
    length, d_model = encoding.shape
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    image = ax.imshow(encoding, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
    ax.set_xlabel("dimension (of %d)" % d_model)
    ax.set_ylabel("position (of %d)" % length)
    ax.set_title("sinusoidal positional encoding: even dimensions sin, odd dimensions cos")
    fig.colorbar(image, ax=ax)
    save(fig, fpath)


def save(fig, fpath):
    """Writes the figure as a PNG output (toolkit.outputs.atomic_file) and closes it."""
    with atomic_file(fpath) as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)


def main(argv=None):
    """The command line: translate.py --plot_attention DIR for the sentences given (see the module docstring)."""
    parser = OneLineParser(prog="plot_attention.py", description="Translate sentences with a trained model and "
                                                                 "draw the cross-attention heads of its last decoder "
                                                                 "block as PNGs (translate.py --plot_attention).")
    parser.add_argument("--logdir", required=True, help="a logdir written by train.py")
    parser.add_argument("--dir", required=True, help="where the PNGs go: positional_encoding.png and NNNN.png, "
                                                     "NNNN the sentence's number counted from 1")
    parser.add_argument("--ckpt", default="", help="checkpoint to use; default the latest in --logdir")
    parser.add_argument("sentences", nargs="+", metavar="SENTENCE", help="sentences to translate and draw")
    args = parser.parse_args(argv)
    check_writable_dir(args.dir, "dir")
    import translate  # TensorFlow only once the command line is known to be good
    return translate.main(["--logdir", args.logdir, "--plot_attention", args.dir]
                          + (["--ckpt", args.ckpt] if args.ckpt else []) + ["--"] + args.sentences)


if __name__ == "__main__":
    run_cli(main)
