"""Vocabulary ids and text I/O shared by every tool: the fixed special ids, reading lines, cleaning, atomic writes.

Every text file the toolkit writes is UTF-8 with one line per sentence and '\\n' line endings; reading accepts
'\\r\\n', a missing final newline, a byte-order mark and gzip compression.
"""
import gzip
import hashlib
import json
import os
import unicodedata
import uuid
import zlib
from pathlib import Path

#: The ids every sentencepiece model of the toolkit is trained with (prepro.py) and every graph relies on.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = {"<pad>": PAD_ID, "<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID}


class PrepError(Exception):
    """A problem with an input file or the data directory, reported as one line without a traceback."""


# Atomic writes


def atomic_write(path, data):
    """Write ``data`` (bytes, or str as UTF-8) to a temporary file beside ``path``, fsync it and rename it into
    place, so that a reader (or a kill -9) sees the old file or the new one, never a torn one. On any error the
    temporary file is removed and the old file (if any) is untouched."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    temp_path = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp_path, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, path)
    except BaseException:
        temp_path.unlink(missing_ok=True)
        raise


def write_lines(path, lines):
    """Atomically write ``lines`` as UTF-8 text, each followed by '\\n'."""
    atomic_write(path, "".join(line + "\n" for line in lines))


def write_json(path, value):
    """Atomically write ``value`` as indented JSON."""
    atomic_write(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def sha256_bytes(data):
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# Reading and cleaning text


def decode_lines(data, name):
    """Split UTF-8 ``data`` into lines; '\\r\\n' and a missing final newline are fine.

    Raises PrepError naming ``name`` and the line number on invalid UTF-8.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_number = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise PrepError(f"{name}: line {line_number} is not valid UTF-8 (byte 0x{data[error.start]:02x} at "
                        f"byte column {column}); convert the file to UTF-8 (e.g. with iconv)") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


#: The first bytes of every gzip file.
GZIP_MAGIC = b"\x1f\x8b"


def gunzip(data, name):
    """``data`` unpacked if it is gzip-compressed (whatever the file is called), else ``data`` itself.

    Raises PrepError naming ``name`` if it is a damaged gzip file.
    """
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise PrepError(f"{name} is not a valid gzip file ({error})") from None


def read_lines(path):
    """Read a UTF-8 text file, gzip-compressed or not, into a list of lines (see decode_lines)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise PrepError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise PrepError(f"{path} is a directory, not a file") from None
    except OSError as error:
        raise PrepError(f"cannot read {path}: {error.strerror}") from None
    return decode_lines(gunzip(data, str(path)), str(path))


def clean_line(line):
    """Unicode NFC, surrounding whitespace removed, inner whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFC", line).split())

