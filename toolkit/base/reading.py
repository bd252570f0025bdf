"""Reading files: UTF-8 text lines one at a time ('\\r\\n', a missing final newline, a byte-order
mark and gzip compression are fine; invalid UTF-8 is a line naming where), JSON and the types of
its values (the one schema check of every JSON file), numbers of any size a range check compares
and a line shows, the cleaning every input line gets, and the sha256 digests that fingerprint a
data dir's vocabulary and downloads."""
import gzip
import hashlib
import io
import json
import math
import os
import sys
import unicodedata
import zlib

from toolkit.base.errors import UserError


#: The byte-order mark some editors put at the start of a UTF-8 file.
UTF8_BOM = b"\xef\xbb\xbf"


def lines_of(handle, name):
    """Yield the lines of a binary file object as str, one at a time, without their '\\n' or
    '\\r\\n'; a missing final newline and a byte-order mark are fine.

    Raises UserError naming ``name``, the line and the byte column on invalid UTF-8.
    """
    for line_number, raw in enumerate(handle, 1):
        if line_number == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM):]
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UserError(f"{name}: line {line_number} is not valid UTF-8 (byte "
                            f"0x{raw[error.start]:02x} at byte column {error.start + 1}); convert "
                            f"the file to UTF-8 (e.g. with iconv)") from None


def decode_lines(data, name):
    """The lines of UTF-8 ``data`` (bytes) as a list (see lines_of)."""
    return list(lines_of(io.BytesIO(data), name))


#: The first bytes of every gzip file.
GZIP_MAGIC = b"\x1f\x8b"


def gunzip(data, name):
    """``data`` unpacked if it is gzip-compressed (whatever the file is called),
    else ``data`` itself.

    Raises UserError naming ``name`` if it is a damaged gzip file.
    """
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise UserError(f"{name} is not a valid gzip file ({error})") from None


def iter_lines(path):
    """Yield the lines of a UTF-8 text file, gzip-compressed or not (whatever it is called), one at
    a time (see lines_of): a file of any size is read in constant memory. Raises UserError on a
    missing, unreadable or damaged file."""
    try:
        with open(path, "rb") as raw:
            handle = gzip.GzipFile(fileobj=raw) if raw.read(2) == GZIP_MAGIC else raw
            raw.seek(0)
            yield from lines_of(handle, str(path))
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not a file") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise UserError(f"{path} is not a valid gzip file ({error})") from None
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None


def read_lines(path):
    """The lines of a text file as a list (see iter_lines)."""
    return list(iter_lines(path))


def clean_line(line):
    """Unicode NFC, surrounding whitespace removed, inner whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFC", line).split())


def loads_json(text):
    """The JSON value of text; an object with a key given twice (which JSON readers settle each
    their own way, Python's by keeping the last) is a ValueError naming the key."""
    return json.loads(text, object_pairs_hook=unique_keys)


def unique_keys(pairs):
    """A JSON object's dict, refusing a key given twice."""
    value = {}
    for key, item in pairs:
        if key in value:
            raise ValueError("the key %s is given twice" % json.dumps(key)[:80])
        value[key] = item
    return value


def read_json(fpath, remedy):
    """The JSON value in fpath (UTF-8, a byte-order mark allowed, no key given twice). A file that
    is not valid JSON (truncated, edited, empty) is a UserError naming it, what is wrong and
    `remedy`, what to do about it."""
    if os.path.exists(fpath) and not os.path.isfile(fpath):  # a FIFO would block the read
        raise UserError("%s is not a regular file: %s" % (fpath, remedy))
    try:
        with open(fpath, encoding="utf-8-sig") as f:
            return loads_json(f.read())
    except (ValueError, UnicodeDecodeError) as error:  # json.JSONDecodeError is a ValueError
        raise UserError("%s is not valid JSON (%s): %s"
                        % (fpath, str(error).splitlines()[0][:120], remedy)) from None
    except RecursionError:
        raise UserError("%s is nested too deeply to be read: %s" % (fpath, remedy)) from None


#: How each type a JSON value may have is named to the user.
JSON_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                   list: "a list", dict: "an object", type(None): "null"}


def type_names(types):
    """How a value of one of ``types`` is named to the user, e.g. "a number or null" (an integer is
    a number)."""
    return " or ".join(JSON_TYPE_NAMES[kind] for kind in types
                       if not (kind is int and float in types))


def type_problem(values, schema, fpath, remedy, where=""):
    """The one sentence naming fpath and the first key of the dict ``values`` whose value is not of
    the type(s) ``schema`` gives for it ({key: type or tuple of types}); None when all fit. Every
    JSON file the toolkit reads is checked through it, since hand edits reach all of them. Keys
    outside the schema, or missing, are the caller's to judge; true is no integer here. where: what
    the keys are named after, in the file (e.g. "splits.")."""
    for key, types in schema.items():
        types = types if isinstance(types, tuple) else (types,)
        if key in values and type(values[key]) not in types:
            return ("%s: %s is %s but must be %s: %s"
                    % (fpath, where + key, json.dumps(values[key])[:80], type_names(types),
                       remedy))
    return None


def is_finite_number(value):
    """Whether value is a number a range check can compare: an integer or a float (true and false
    are none), finite as a float. An integer too large for a float, which a flag or a JSON file
    may hold, is not finite: math.isfinite would raise OverflowError on it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


#: Digits of an integer that a line shows in full; a longer one is shown by its first digits.
SHOWN_DIGITS = 24


def shown_number(value):
    """How a line shows a value given where a number belongs: a number as Python writes it, but an
    integer of more than SHOWN_DIGITS digits by its first ones and how many it has (one of 401
    digits stays a short line); anything else as JSON."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            text = str(value)
        except ValueError:  # beyond Python's limit of digits in a conversion
            return "an integer of over %d digits" % sys.get_int_max_str_digits()
        digits = len(text.lstrip("-"))
        return text if digits <= SHOWN_DIGITS else "%s... (%d digits)" % (text[:12], digits)
    if isinstance(value, float):
        return str(value)
    return json.dumps(value)[:80]


def check_types(values, schema, fpath, remedy, where=""):
    """Raises the UserError of type_problem, if any."""
    problem = type_problem(values, schema, fpath, remedy, where)
    if problem:
        raise UserError(problem)


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
