"""PNG heat maps of attention weights and of the positional encoding: translate.py --plot_attention
DIR and plot_attention.py. The only module of the toolkit that imports matplotlib
(scripts/plot_recipe.py, the recipe's plot, aside), imported only when plots are asked for; it draws
with the Agg backend, so no display is needed."""
import math
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402

from modules import positional_encoding  # noqa: E402
from toolkit.base.ids import PAD_ID  # noqa: E402
from toolkit.base.writing import atomic_file, check_output_dir, check_writable_dir  # noqa: E402

tf1 = tf.compat.v1

#: The names of the PNGs written in DIR (AttentionPlots): positional_encoding.png, NNNN.png for
#: line NNNN and NNNN-P.png for part P of a split one.
PLOT_NAME = re.compile(r"positional_encoding\.png|\d{4,}(-\d+)?\.png")

#: Positions drawn in DIR/positional_encoding.png.
PLOTTED_POSITIONS = 100


#: Largest number of head panels side by side.
MAX_COLUMNS = 4


def plot_attention_heads(attention, source_pieces, target_pieces, fpath, title=""):
    """One heat map per head, in a grid, saved as a PNG.

    attention: (h, T2, T1) numpy array, weights of target position t over source position s (rows
    sum to 1).
    source_pieces: T1 labels of the x axis. target_pieces: T2 labels of the y axis.
    """
    num_heads, t2, t1 = attention.shape
    columns = min(num_heads, MAX_COLUMNS)
    rows = math.ceil(num_heads / columns)
    # inches: one row or column per piece, and labels
    panel_width, panel_height = 1.8 + 0.22 * t1, 1.6 + 0.22 * t2
    fig, axes = plt.subplots(rows, columns,
                             figsize=(columns * panel_width, rows * panel_height + 0.6),
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
    fig.suptitle(title or "cross-attention of the last decoder block (rows: target, columns: "
                          "source)", fontsize=9)
    save(fig, fpath)


def plot_positional_encoding(encoding, fpath):
    """encoding: (T, d_model) numpy array of the sinusoidal positional encoding. Saves it as a PNG
    heat map."""
    length, d_model = encoding.shape
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    image = ax.imshow(encoding, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
    ax.set_xlabel("dimension (of %d)" % d_model)
    ax.set_ylabel("position (of %d)" % length)
    ax.set_title("sinusoidal positional encoding: even dimensions sin, odd dimensions cos")
    fig.colorbar(image, ax=ax)
    save(fig, fpath)


def save(fig, fpath):
    """Writes the figure as a PNG output (toolkit.base.writing.atomic_file) and closes it."""
    with atomic_file(fpath) as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)


def check_plot_dir(directory, flag, inputs, dirs):
    """Raises UserError unless the PNGs can go in directory (given as --flag): a directory this
    process can write in, not one of dirs (the logdir and data dir the tool reads), and none of the
    PNGs it would replace there one of inputs or a file of dirs (outputs.check_output_dir)."""
    check_writable_dir(directory, flag)
    check_output_dir(directory, flag, inputs, dirs, PLOT_NAME.fullmatch)


class AttentionPlots:
    """Writes the PNGs of --plot_attention DIR: the positional encoding at once,
    then those of each line."""

    def __init__(self, directory, sp, d_model):
        self.directory, self.sp = directory, sp
        os.makedirs(directory, exist_ok=True)
        with tf.Graph().as_default(), tf1.Session() as sess:
            encoding = sess.run(positional_encoding(tf.zeros([1, PLOTTED_POSITIONS, d_model])))[0]
        plot_positional_encoding(encoding, os.path.join(directory, "positional_encoding.png"))

    def pieces(self, ids):
        """Labels of ids (a list ending in </s>)."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def write(self, number, sources, part_results):
        """One PNG per part of input line `number`: DIR/NNNN.png,
        or DIR/NNNN-P.png for a split line."""
        for part, (source, result) in enumerate(zip(sources, part_results), 1):
            ids, attention = result.ids, result.attention
            target = [int(i) for i in ids[0] if i != PAD_ID]
            name = "%04d.png" % number if len(sources) == 1 else "%04d-%d.png" % (number, part)
            title = "line %d%s: last decoder block's cross-attention" % (
                number, "" if len(sources) == 1 else ", part %d" % part)
            plot_attention_heads(attention[:, :len(target), :len(source)], self.pieces(source),
                                           self.pieces(target), os.path.join(self.directory, name),
                                 title)
