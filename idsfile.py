"""The binary ids of one side of a split: prepro.py writes them in chunks, data_load.py memory-maps them.

A side of a split is two files:
    SPLIT.SIDE.ids      the BPE ids of every line, one line after another, without <s> or </s>: little-endian
                        uint16 when the vocabulary has fewer than 65536 pieces, else little-endian int32
    SPLIT.SIDE.offsets  little-endian int64, one more entry than lines: line i is ids[offsets[i]:offsets[i + 1]]
                        (offsets[0] = 0; an empty line has offsets[i] == offsets[i + 1])
The dtype of the ids is the manifest's "ids_dtype" (docs/data.md).
"""
import itertools
import os

import numpy as np

from errors import UserError

OFFSETS_DTYPE = np.dtype("<i8")


def ids_dtype(vocab_size):
    """The dtype of the ids of a vocabulary of vocab_size pieces: uint16 below 65536, else int32."""
    return np.dtype("<u2") if vocab_size < 65536 else np.dtype("<i4")


class IdsWriter:
    """Appends lines of ids to SPLIT.SIDE.ids and their offsets to SPLIT.SIDE.offsets, chunk by chunk."""

    def __init__(self, ids_path, offsets_path, dtype):
        """ids_path, offsets_path: the two files (created or truncated). dtype: see ids_dtype."""
        self.dtype = np.dtype(dtype)
        self.ids, self.offsets = open(ids_path, "wb"), open(offsets_path, "wb")
        self.end = 0  # ids written so far: the offset of the next line
        np.zeros(1, OFFSETS_DTYPE).tofile(self.offsets)

    def write(self, lines):
        """lines: a list of lists of ids (one list per line, maybe empty)."""
        lengths = np.fromiter((len(line) for line in lines), np.int64, len(lines))
        flat = np.fromiter(itertools.chain.from_iterable(lines), self.dtype, int(lengths.sum()))
        flat.tofile(self.ids)
        (self.end + np.cumsum(lengths)).astype(OFFSETS_DTYPE).tofile(self.offsets)
        self.end += int(lengths.sum())

    def close(self):
        """Flush both files to disk and close them."""
        for handle in (self.ids, self.offsets):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()


def read_ids(ids_path, offsets_path, dtype):
    """Memory-map one side: returns (ids (total,) of dtype, offsets (lines + 1,) int64), both read-only; pages
    are read from disk when a batch touches them, and every process that maps the files shares them."""
    offsets = np.memmap(offsets_path, OFFSETS_DTYPE, mode="r")
    dtype = np.dtype(dtype)
    if os.path.getsize(ids_path) != offsets[-1] * dtype.itemsize:
        raise UserError("%s holds %d bytes but %s ends at id %d: the data dir is damaged; rebuild it with "
                        "`python prepro.py --force` and the options it was built with"
                        % (ids_path, os.path.getsize(ids_path), offsets_path, offsets[-1]))
    if offsets[-1] == 0:  # no ids at all: an empty file cannot be mapped
        return np.zeros(0, dtype), offsets
    return np.memmap(ids_path, dtype, mode="r"), offsets
