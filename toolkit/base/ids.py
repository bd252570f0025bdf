"""The ids every sentencepiece model of the toolkit is trained with (prepro.py) and every graph
relies on."""
import itertools
import mmap
import os

import numpy as np

from toolkit.base.errors import UserError


#: The ids every sentencepiece model of the toolkit is trained with (prepro.py) and every graph
#: relies on.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_PIECES = {"<pad>": PAD_ID, "<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID}


OFFSETS_DTYPE = np.dtype("<i8")


def ids_dtype(vocab_size):
    """The dtype of the ids of a vocabulary of vocab_size pieces: uint16 below 65536, else int32."""
    return np.dtype("<u2") if vocab_size < 65536 else np.dtype("<i4")


class IdsWriter:
    """Appends lines of ids to SPLIT.SIDE.ids and their offsets to SPLIT.SIDE.offsets,
    chunk by chunk."""

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


def map_file(path, dtype):
    """A read-only array over a memory-mapped file (see release_pages)."""
    with open(path, "rb") as handle:
        return np.frombuffer(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), dtype)


def read_ids(ids_path, offsets_path, dtype):
    """Memory-map one side: returns (ids (total,) of dtype, offsets (lines + 1,) int64), both
    read-only; pages are read from disk (or the page cache) when a batch touches them, and every
    process that maps the files shares them."""
    offsets = map_file(offsets_path, OFFSETS_DTYPE)
    dtype = np.dtype(dtype)
    if os.path.getsize(ids_path) != offsets[-1] * dtype.itemsize:
        raise UserError("%s holds %d bytes but %s ends at id %d: the data dir is damaged; rebuild "
                        "it with `python prepro.py --force` and the options it was built with"
                        % (ids_path, os.path.getsize(ids_path), offsets_path, offsets[-1]))
    if offsets[-1] == 0:  # no ids at all: an empty file cannot be mapped
        return np.zeros(0, dtype), offsets
    return map_file(ids_path, dtype), offsets


def release_pages(*arrays):
    """Take the pages of the memory-mapped arrays (or views of them) out of this process's resident
    memory. They stay in the kernel's page cache and come back on the next touch without reading the
    disk. Without this, every page a batch touched (and the pages the kernel maps around it) would
    count in the process's RSS until the kernel needed the memory: hundreds of MB within a few
    hundred batches of a large corpus. Other arrays are left alone."""
    for array in arrays:
        while isinstance(array, np.ndarray):
            array = array.base
        # np.frombuffer's base
        if isinstance(array, memoryview) and isinstance(array.obj, mmap.mmap):
            array.obj.madvise(mmap.MADV_DONTNEED)
