"""Turn a parallel corpus into a data directory that training and testing read.

Usage: ``python prepro.py --dataset {numbers,multi30k,iwslt2016,files} [--data_dir DIR] [options]``
(``python prepro.py --help`` explains every flag).

Side 1 is the source language and side 2 the target everywhere; "eval" is the dev split.
The data directory (default ``data/NAME``) holds::

    manifest.json                 what was built, from what, with which options (written last)
    bpe.model, bpe.vocab          one joint sentencepiece BPE model trained on both sides of train;
                                  bpe.vocab line i is "piece<TAB>score" of id i;
                                  fixed ids <pad>=0, <unk>=1, <s>=2, </s>=3
    train.1 train.2               cleaned text, UTF-8, one sentence per line, '\\n' line endings
    eval.1 eval.2 test.1 test.2
    train.1.bpe ... test.2.bpe    the same lines as sentencepiece pieces joined by single spaces
                                  (an empty line stays empty)
    download/                     cached downloads (multi30k, iwslt2016 only)

Cleaning keeps every line: it strips '\\r' and surrounding whitespace, collapses inner whitespace
to single spaces and applies Unicode NFC.  Training pairs with an empty side are dropped; duplicate
pairs and pairs whose sides differ in length by more than ``--max_ratio`` (in BPE pieces) are
reported, and dropped from train with ``--dedup`` / ``--filter_ratio``.  Dev and test lines are
never dropped or reordered, and an empty dev or test split is refused.  Input files may be
gzip-compressed.  A build is written into a staging directory inside the data directory and its
files are renamed into place only once all are complete, manifest.json last, so a directory with a
manifest is complete, and a failed rebuild (--force) leaves the previous build usable.  Re-running
with the same inputs and options does nothing; other inputs or options need another --data_dir or
--force.
"""

import calendar
import contextlib
import gzip
import hashlib
import html
import http.client
import io
import json
import os
import random
import re
import shutil
import sys
import tarfile
import tempfile
import time
import unicodedata
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path

import sentencepiece as spm
from tqdm import tqdm

from errors import USER_ERROR_EXIT_CODE, OneLineParser, UserError, report

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.json"
BPE_MODEL = "bpe.model"
BPE_VOCAB = "bpe.vocab"
SPLITS = ("train", "eval", "test")
SIDES = (1, 2)
SPECIAL_IDS = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
DATASETS = ("numbers", "multi30k", "iwslt2016", "files")
DEFAULT_VOCAB_SIZE = {"numbers": 1000, "multi30k": 32000, "iwslt2016": 32000, "files": 32000}
DEFAULT_MAX_RATIO = 9.0
DOWNLOAD_TIMEOUT_S = 30

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_FILES = {
    ("train", 1): "train.de.gz", ("train", 2): "train.en.gz",
    ("eval", 1): "val.de.gz", ("eval", 2): "val.en.gz",
    ("test", 1): "test_2016_flickr.de.gz", ("test", 2): "test_2016_flickr.en.gz",
}
# sha256 of the unpacked files of multi30k/dataset data/task1/raw (commit a3d2e0d).
MULTI30K_SHA256 = {
    "train.de.gz": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en.gz": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "val.de.gz": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.en.gz": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "test_2016_flickr.de.gz": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.en.gz": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
}
IWSLT2016_URL = "https://wit3.fbk.eu/archive/2016-01/texts/de/en/de-en.tgz"
IWSLT2016_FILES = {
    ("train", 1): "train.tags.de-en.de", ("train", 2): "train.tags.de-en.en",
    ("eval", 1): "IWSLT16.TED.tst2013.de-en.de.xml", ("eval", 2): "IWSLT16.TED.tst2013.de-en.en.xml",
    ("test", 1): "IWSLT16.TED.tst2014.de-en.de.xml", ("test", 2): "IWSLT16.TED.tst2014.de-en.en.xml",
}
FILE_FLAGS = {(split, side): f"{split}{side}" for split in SPLITS for side in SIDES}


#: A problem with the input or the data directory: the toolkit's one kind of user error (errors.py).
PrepError = UserError


def log(message):
    """Print one progress line."""
    print(f"prepro: {message}", flush=True)


# ----------------------------------------------------------------------------------------------
# Atomic file writes


def atomic_write_bytes(path, data):
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    path = Path(path)
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
    atomic_write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def write_json(path, value):
    """Atomically write ``value`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


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


def check_same_length(lines1, lines2, name1, name2):
    """Raise PrepError unless the two sides of a parallel corpus have the same number of lines."""
    if len(lines1) != len(lines2):
        raise PrepError(f"{name1} has {len(lines1)} lines but {name2} has {len(lines2)}: "
                        "the two sides of a parallel corpus must have one line per sentence pair")


# ----------------------------------------------------------------------------------------------
# The synthetic numbers corpus (German -> English)

GERMAN_SMALL = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn",
                "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn"]
GERMAN_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]
GERMAN_ORDINAL_IRREGULAR = {1: "erste", 3: "dritte", 7: "siebte", 8: "achte"}
GERMAN_MONTHS = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September",
                 "Oktober", "November", "Dezember"]
ENGLISH_SMALL = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                 "nineteen"]
ENGLISH_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ENGLISH_ORDINAL_IRREGULAR = {1: "first", 2: "second", 3: "third", 5: "fifth", 8: "eighth", 9: "ninth",
                             12: "twelfth"}
ENGLISH_MONTHS = list(calendar.month_name)[1:]
NUMBER_TEMPLATES = [
    ("{number}", "{number}"),
    ("Die Zahl ist {number}.", "The number is {number}."),
    ("Er zählt bis {number}.", "He counts to {number}."),
]
DATE_TEMPLATES = [
    ("der {day} {month} {year}", "the {day} of {month} {year}"),
    ("Heute ist der {day} {month} {year}.", "Today is the {day} of {month} {year}."),
    ("Sie wurde am {day_dative} {month} {year} geboren.", "She was born on the {day} of {month} {year}."),
]
FIRST_YEAR, LAST_YEAR = 1800, 2099
MAX_DIGITS = 6
MAX_NUMBERS_PAIRS = 1_000_000


def german_below_hundred(number, final):
    """German words for 1..99; a trailing 1 is 'eins' only at the end of the whole numeral."""
    if number < 20:
        return "ein" if number == 1 and not final else GERMAN_SMALL[number]
    tens, units = divmod(number, 10)
    if units == 0:
        return GERMAN_TENS[tens]
    return ("ein" if units == 1 else GERMAN_SMALL[units]) + "und" + GERMAN_TENS[tens]


def german_below_thousand(number, final):
    """German words for 1..999 as one compound ('einhundertdreiundzwanzig')."""
    hundreds, rest = divmod(number, 100)
    words = german_below_hundred(hundreds, final=False) + "hundert" if hundreds else ""
    return words + german_below_hundred(rest, final) if rest else words


def german_cardinal(number):
    """German numeral for 0..999,999 as one word, e.g. 21 -> 'einundzwanzig'."""
    if number == 0:
        return GERMAN_SMALL[0]
    thousands, rest = divmod(number, 1000)
    words = german_below_thousand(thousands, final=False) + "tausend" if thousands else ""
    return words + german_below_thousand(rest, final=True) if rest else words


def german_ordinal(day):
    """German ordinal (nominative, after 'der') for 1..31, e.g. 3 -> 'dritte'."""
    if day in GERMAN_ORDINAL_IRREGULAR:
        return GERMAN_ORDINAL_IRREGULAR[day]
    return german_cardinal(day) + ("te" if day < 20 else "ste")


def german_year(year):
    """German year: 1984 -> 'neunzehnhundertvierundachtzig', 2014 -> 'zweitausendvierzehn'."""
    if year >= 2000:
        return german_cardinal(year)
    century, rest = divmod(year, 100)
    words = german_below_hundred(century, final=False) + "hundert"
    return words + german_below_hundred(rest, final=True) if rest else words


def english_below_hundred(number):
    """English words for 0..99, e.g. 21 -> 'twenty-one'."""
    if number < 20:
        return ENGLISH_SMALL[number]
    tens, units = divmod(number, 10)
    return ENGLISH_TENS[tens] + (f"-{ENGLISH_SMALL[units]}" if units else "")


def english_below_thousand(number):
    """English words for 1..999 with British 'and': 121 -> 'one hundred and twenty-one'."""
    hundreds, rest = divmod(number, 100)
    parts = [f"{ENGLISH_SMALL[hundreds]} hundred"] if hundreds else []
    if rest:
        parts += ["and", english_below_hundred(rest)] if hundreds else [english_below_hundred(rest)]
    return " ".join(parts)


def english_cardinal(number):
    """English numeral for 0..999,999, e.g. 1001 -> 'one thousand and one'."""
    if number == 0:
        return ENGLISH_SMALL[0]
    thousands, rest = divmod(number, 1000)
    parts = [english_below_thousand(thousands) + " thousand"] if thousands else []
    if rest:
        parts += ["and"] if thousands and rest < 100 else []
        parts.append(english_below_thousand(rest))
    return " ".join(parts)


def english_ordinal(day):
    """English ordinal for 1..31, e.g. 21 -> 'twenty-first'."""
    if day in ENGLISH_ORDINAL_IRREGULAR:
        return ENGLISH_ORDINAL_IRREGULAR[day]
    if day < 20:
        return ENGLISH_SMALL[day] + "th"
    tens, units = divmod(day, 10)
    if units == 0:
        return ENGLISH_TENS[tens][:-1] + "ieth"
    return f"{ENGLISH_TENS[tens]}-{english_ordinal(units)}"


def english_year(year):
    """English year: 1984 -> 'nineteen eighty-four', 1905 -> 'nineteen oh five', 2014 -> 'two thousand and fourteen'."""
    if year >= 2000:
        return english_cardinal(year)
    century, rest = divmod(year, 100)
    if rest == 0:
        return f"{english_below_hundred(century)} hundred"
    if rest < 10:
        return f"{english_below_hundred(century)} oh {ENGLISH_SMALL[rest]}"
    return f"{english_below_hundred(century)} {english_below_hundred(rest)}"


def number_pair(number, template):
    """(German, English) sentence for an integer in one of NUMBER_TEMPLATES."""
    german, english = NUMBER_TEMPLATES[template]
    return german.format(number=german_cardinal(number)), english.format(number=english_cardinal(number))


def date_pair(year, month, day, template):
    """(German, English) sentence for a calendar date in one of DATE_TEMPLATES."""
    german, english = DATE_TEMPLATES[template]
    german_day = german_ordinal(day)
    return (german.format(day=german_day, day_dative=german_day + "n", month=GERMAN_MONTHS[month - 1],
                          year=german_year(year)),
            english.format(day=english_ordinal(day), month=ENGLISH_MONTHS[month - 1], year=english_year(year)))


def random_pair(rng):
    """One random (German, English) pair: half numbers (digit count uniform 1..6), half dates."""
    if rng.random() < 0.5:
        digits = rng.randint(1, MAX_DIGITS)
        number = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
        return number_pair(number, rng.randrange(len(NUMBER_TEMPLATES)))
    year = rng.randint(FIRST_YEAR, LAST_YEAR)
    month = rng.randint(1, 12)
    day = rng.randint(1, calendar.monthrange(year, month)[1])
    return date_pair(year, month, day, rng.randrange(len(DATE_TEMPLATES)))


def unzip_pairs(pairs):
    """[(source, target), ...] -> ([source, ...], [target, ...])."""
    return [source for source, _ in pairs], [target for _, target in pairs]


def numbers_corpus(n_train, n_eval, n_test, seed):
    """The synthetic German->English corpus: {split: (german_lines, english_lines)}.

    Every source sentence occurs once in the whole corpus, so the splits are disjoint; the same seed
    always gives the same corpus.
    """
    total = n_train + n_eval + n_test
    if min(n_train, n_eval, n_test) < 1 or total > MAX_NUMBERS_PAIRS:
        raise PrepError(f"numbers corpus sizes must be at least 1 each and {MAX_NUMBERS_PAIRS} in all "
                        f"(got --n_train {n_train} --n_eval {n_eval} --n_test {n_test})")
    rng = random.Random(seed)
    seen, pairs = set(), []
    while len(pairs) < total:
        german, english = random_pair(rng)
        if german not in seen:
            seen.add(german)
            pairs.append((german, english))
    rng.shuffle(pairs)
    return {"train": unzip_pairs(pairs[n_eval + n_test:]), "eval": unzip_pairs(pairs[:n_eval]),
            "test": unzip_pairs(pairs[n_eval:n_eval + n_test])}


# ----------------------------------------------------------------------------------------------
# Downloads and archives


def offline_hint():
    """The advice given when a download fails."""
    return ("to use local copies instead run: prepro.py --dataset files --train1 F --train2 F "
            "--eval1 F --eval2 F --test1 F --test2 F")


def download(url, path):
    """Download ``url`` to ``path`` (atomically), reusing an earlier download of the same URL.

    A file ``path.url`` beside the download records where it came from.
    """
    path = Path(path)
    source_record = path.with_name(path.name + ".url")
    if path.exists() and source_record.exists() and source_record.read_text(encoding="utf-8") == url:
        log(f"using cached {path}")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    source_record.unlink(missing_ok=True)
    log(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=path.name, disable=None) as progress:
                chunks = []
                for chunk in iter(lambda: response.read(1 << 16), b""):
                    chunks.append(chunk)
                    progress.update(len(chunk))
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise PrepError(f"cannot download {url} ({download_error_reason(error)}); {offline_hint()}") from None
    received = sum(len(chunk) for chunk in chunks)
    if total and received != total:
        raise PrepError(f"download of {url} was cut short ({received} of {total} bytes); "
                        f"try again or {offline_hint()}")
    atomic_write_bytes(path, b"".join(chunks))
    atomic_write_bytes(source_record, url.encode("utf-8"))


def download_error_reason(error):
    """A short reason for a failed download: the HTTP status or the network error."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return str(error.reason)
    return str(error) or type(error).__name__


def discard_download(path):
    """Remove a cached download (and its URL record) whose content was rejected."""
    path = Path(path)
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".url").unlink(missing_ok=True)


def read_maybe_gzipped(path, url):
    """The bytes of a download, gunzipped if it is a gzip file."""
    try:
        return gunzip(Path(path).read_bytes(), url)
    except PrepError as error:
        discard_download(path)
        raise PrepError(f"{error}; the download was removed, try again or {offline_hint()}") from None


def unsafe_member_reason(member):
    """Why a tar member could land outside the extraction directory, or None if it is safe."""
    name = member.name
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "'..' in path"
    if member.issym() or member.islnk():
        return "link"
    if not (member.isfile() or member.isdir()):
        return "not a regular file or directory"
    return None


def safe_extract(archive, target_dir):
    """Extract a tar archive into ``target_dir``; reject the whole archive if any member is unsafe.

    Members with absolute paths, '..', links or special files are refused, and tarfile's 'data'
    filter guards the extraction itself.
    """
    target_dir = Path(target_dir)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                reason = unsafe_member_reason(member)
                if reason:
                    raise PrepError(f"refusing to extract {archive}: member {member.name!r} is unsafe ({reason})")
            target_dir.mkdir(parents=True, exist_ok=True)
            tar.extractall(target_dir, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as error:
        raise PrepError(f"cannot extract {archive}: {error}") from None


def find_extracted(root, name, archive):
    """The first file (in sorted order) called ``name`` anywhere below ``root``."""
    matches = sorted(path for path in Path(root).rglob(name) if path.is_file())
    if not matches:
        raise PrepError(f"{archive} has no file named {name}; is it the IWSLT 2016 de-en archive (de-en.tgz)?")
    return matches[0]


def multi30k_splits(download_dir, base_url, verify):
    """Download (or reuse) Multi30k task 1 and return (splits, sources, downloads)."""
    lines, sources, downloads = {}, {}, []
    for (split, side), name in MULTI30K_FILES.items():
        url = f"{base_url.rstrip('/')}/{name}"
        path = Path(download_dir) / name
        download(url, path)
        downloads.append({"url": url, "file": f"download/{name}", "sha256": sha256_file(path)})
        data = read_maybe_gzipped(path, url)
        if verify and sha256_bytes(data) != MULTI30K_SHA256[name]:
            discard_download(path)
            raise PrepError(f"{url} unpacks to sha256 {sha256_bytes(data)}, expected {MULTI30K_SHA256[name]} "
                            "(Multi30k task 1 raw); the download was removed. If your mirror serves another "
                            "version on purpose, pass --no_verify")
        lines[split, side] = decode_lines(data, url)
        sources[FILE_FLAGS[split, side]] = url
    return pair_up(lines, sources), sources, downloads


def strip_markup_lines(lines):
    """IWSLT train.tags: drop the lines holding talk metadata (those starting with '<')."""
    return [line for line in lines if not line.lstrip().startswith("<")]


def xml_segments(lines):
    """IWSLT dev/test XML: the text of every <seg> element, in order."""
    segments = []
    for line in lines:
        match = re.search(r"<seg[^>]*>(.*)</seg>", line)
        if match:
            segments.append(html.unescape(match.group(1)))
    return segments


def iwslt2016_splits(download_dir, url):
    """Download (or reuse) the IWSLT 2016 de-en archive and return (splits, sources, downloads).

    Train is train.tags.de-en without markup lines, dev (eval) is tst2013, test is tst2014.
    """
    archive = Path(download_dir) / "de-en.tgz"
    download(url, archive)
    downloads = [{"url": url, "file": "download/de-en.tgz", "sha256": sha256_file(archive)}]
    extracted = Path(download_dir) / "de-en.extracted"
    shutil.rmtree(extracted, ignore_errors=True)
    try:
        safe_extract(archive, extracted)
    except PrepError:
        discard_download(archive)
        shutil.rmtree(extracted, ignore_errors=True)
        raise
    lines, sources = {}, {}
    for (split, side), name in IWSLT2016_FILES.items():
        text = read_lines(find_extracted(extracted, name, url))
        lines[split, side] = strip_markup_lines(text) if split == "train" else xml_segments(text)
        sources[FILE_FLAGS[split, side]] = f"{url}#{name}"
    return pair_up(lines, sources), sources, downloads


def pair_up(lines, sources):
    """{(split, side): lines} -> {split: (lines1, lines2)}, checking that both sides have equal length."""
    splits = {}
    for split in SPLITS:
        check_same_length(lines[split, 1], lines[split, 2], sources[FILE_FLAGS[split, 1]],
                          sources[FILE_FLAGS[split, 2]])
        splits[split] = (lines[split, 1], lines[split, 2])
    return splits


def file_splits(paths):
    """Read local parallel files {flag: path} and return (splits, sources)."""
    for flag, path in paths.items():
        if Path(path).is_dir():
            raise PrepError(f"{path} is a directory, not a file (--{flag})")
        if not Path(path).is_file():
            raise PrepError(f"file not found: {path} (--{flag})")
    lines = {key: read_lines(paths[flag]) for key, flag in FILE_FLAGS.items()}
    sources = {flag: str(path) for flag, path in paths.items()}
    return pair_up(lines, sources), sources


# ----------------------------------------------------------------------------------------------
# Filtering and statistics


def is_empty_pair(source, target):
    """A pair is empty when either side has no text."""
    return not source or not target


def count_empty_and_repeated(pairs):
    """Counts of pairs with an empty side, and of non-empty pairs that repeat an earlier pair."""
    full = [pair for pair in pairs if not is_empty_pair(*pair)]
    return {"empty_pairs": len(pairs) - len(full), "duplicate_pairs": len(full) - len(set(full))}


def select_training_pairs(pairs, dedup):
    """Training pairs without an empty side and, with ``dedup``, without repeats (first one kept)."""
    full = [pair for pair in pairs if not is_empty_pair(*pair)]
    return list(dict.fromkeys(full)) if dedup else full


def length_ratio(pieces1, pieces2):
    """How many times longer the longer side is (in BPE pieces)."""
    shorter, longer = sorted((len(pieces1), len(pieces2)))
    return longer / max(shorter, 1)


def ratio_outliers(pairs, encoded, max_ratio):
    """For each non-empty pair, whether one side has more than ``max_ratio`` times the other's pieces."""
    return [not is_empty_pair(*pair) and length_ratio(*pieces) > max_ratio for pair, pieces in zip(pairs, encoded)]


# ----------------------------------------------------------------------------------------------
# BPE


def train_bpe(sentences, vocab_size):
    """Train the joint BPE model on ``sentences``; returns the serialized model.

    Training reads every sentence in order (no sampling or shuffling), so it is deterministic.
    """
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type="bpe", vocab_size=vocab_size,
            character_coverage=1.0, normalization_rule_name="identity",
            pad_id=SPECIAL_IDS["<pad>"], unk_id=SPECIAL_IDS["<unk>"], bos_id=SPECIAL_IDS["<s>"],
            eos_id=SPECIAL_IDS["</s>"], pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            input_sentence_size=0, shuffle_input_sentence=False, num_threads=1, minloglevel=2)
    except RuntimeError as error:
        raise PrepError(vocab_size_message(str(error), vocab_size)) from None
    return model.getvalue()


def vocab_file_lines(processor):
    """The lines of a sentencepiece .vocab file: "piece<TAB>score" for ids 0, 1, 2, ..."""
    return [f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}" for i in range(processor.get_piece_size())]


def vocab_size_message(error_text, vocab_size):
    """Turn sentencepiece's training error into one line that says what to change."""
    too_high = re.search(r"value <= (\d+)", error_text)
    if too_high:
        return (f"--vocab_size {vocab_size} is too large for this training corpus: "
                f"use --vocab_size {too_high.group(1)} or less")
    too_small = re.search(r"required_chars\. (\d+) vs (\d+)", error_text)
    if too_small:
        return (f"--vocab_size {vocab_size} is smaller than the {too_small.group(2)} pieces this corpus needs "
                f"(characters plus 4 special ids): use --vocab_size {too_small.group(2)} or more")
    return f"sentencepiece could not train the BPE model: {error_text.splitlines()[-1]}"


def encode_lines(processor, lines):
    """BPE pieces of each line (an empty line has none)."""
    return processor.encode(list(lines), out_type=str)


# ----------------------------------------------------------------------------------------------
# The data directory


def split_files(split):
    """File names of one split, as listed in the manifest."""
    return {"raw1": f"{split}.1", "raw2": f"{split}.2", "bpe1": f"{split}.1.bpe", "bpe2": f"{split}.2.bpe"}


def output_files(manifest):
    """Every file a finished data directory must hold, manifest excluded."""
    names = [manifest["bpe_model"], manifest["bpe_vocab"]]
    for split in manifest["splits"].values():
        names += [split[key] for key in ("raw1", "raw2", "bpe1", "bpe2")]
    return names


def read_manifest(data_dir):
    """The manifest of ``data_dir`` as a dict, or None if there is none."""
    path = Path(data_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:
        raise PrepError(f"{path} is unreadable ({error}); pass --force to rebuild {data_dir}") from None


def describe_inputs(splits, sources):
    """{flag: {"source": where it came from, "sha256": of its lines joined by '\\n'}} for each side."""
    inputs = {}
    for split in SPLITS:
        for side in SIDES:
            flag = FILE_FLAGS[split, side]
            inputs[flag] = {"source": sources.get(flag, "in memory"),
                            "sha256": sha256_bytes("\n".join(splits[split][side - 1]).encode("utf-8"))}
    return inputs


def build_differences(manifest, options, inputs):
    """What differs between an existing build and the requested one, as short phrases."""
    differences = []
    if manifest.get("format") != MANIFEST_FORMAT:
        differences.append(f"manifest format {manifest.get('format')} -> {MANIFEST_FORMAT}")
    old_options = manifest.get("options", {})
    for key in sorted(set(old_options) | set(options)):
        if old_options.get(key) != options.get(key):
            differences.append(f"{key} {old_options.get(key)!r} -> {options.get(key)!r}")
    old_inputs = manifest.get("inputs", {})
    for flag in inputs:
        if old_inputs.get(flag, {}).get("sha256") != inputs[flag]["sha256"]:
            differences.append(f"{flag} content changed")
    return differences


def is_up_to_date(data_dir, options, inputs, force):
    """True if ``data_dir`` already holds this exact build.

    Raises PrepError if it holds another build, unless ``force``: then the old build stays usable
    until the new one is complete (see publish).
    """
    manifest_path = Path(data_dir) / MANIFEST_NAME
    if force:
        return False
    manifest = read_manifest(data_dir)
    if manifest is None:
        return False
    differences = build_differences(manifest, options, inputs)
    if differences:
        raise PrepError(f"{data_dir} was built from other inputs or options ({'; '.join(differences)}): "
                        "pass another --data_dir, or --force to rebuild it")
    missing = [name for name in output_files(manifest) if not (Path(data_dir) / name).is_file()]
    if missing:
        log(f"{data_dir} misses {', '.join(missing)}; rebuilding it")
        manifest_path.unlink()
        return False
    return True


def check_data_dir(data_dir):
    """Raise PrepError if a file stands where the data directory should be."""
    if data_dir.exists() and not data_dir.is_dir():
        raise PrepError(f"--data_dir {data_dir} is a file, not a directory")


def build_data_dir(data_dir, splits, options, sources=None, downloads=None, force=False):
    """Write a complete data directory from in-memory splits and return its manifest.

    ``splits`` maps train/eval/test to (source_lines, target_lines) of raw text; ``options`` must hold
    dataset, vocab_size, dedup, filter_ratio, max_ratio, src_lang and tgt_lang plus any other option
    that shaped the input; ``sources`` names where each side came from (keys train1 ... test2).
    Does nothing if ``data_dir`` already holds the same build.
    """
    data_dir = Path(data_dir)
    check_data_dir(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    inputs = describe_inputs(splits, sources or {})
    if is_up_to_date(data_dir, options, inputs, force):
        log(f"{data_dir} is up to date (same inputs and options); nothing to do")
        return read_manifest(data_dir)

    cleaned = {split: [(clean_line(source), clean_line(target)) for source, target in zip(*splits[split])]
               for split in SPLITS}
    for split in ("eval", "test"):
        if not cleaned[split]:
            name = "dev" if split == "eval" else "test"
            raise PrepError(f"the {name} split is empty ({describe_sides(split, sources)}): train.py scores BLEU on "
                            f"dev and test.py on test; give at least one {name} pair")
    train_pairs = select_training_pairs(cleaned["train"], options["dedup"])
    if not train_pairs:
        raise PrepError("no training pairs are left after dropping empty ones; check the train files")
    with staging_dir(data_dir) as staging:
        processor = write_bpe_model(staging, train_pairs, options["vocab_size"])
        split_reports = {}
        for split in SPLITS:
            pairs = train_pairs if split == "train" else cleaned[split]
            split_reports[split] = write_split(staging, split, cleaned[split], pairs, processor, options)
            log(describe_split(split, split_reports[split], options))
        manifest = build_manifest(options, processor, inputs, downloads, split_reports)
        write_json(staging / MANIFEST_NAME, manifest)
        publish(staging, data_dir)
    return manifest


def describe_sides(split, sources):
    """Where the two sides of a split came from, for messages: "--eval1 a.de, --eval2 a.en"."""
    return ", ".join(f"--{FILE_FLAGS[split, side]} {(sources or {}).get(FILE_FLAGS[split, side], '?')}"
                     for side in SIDES)


#: Prefix of the directory inside --data_dir where a build is written before publish moves it into place.
STAGING_PREFIX = ".build-"


@contextlib.contextmanager
def staging_dir(data_dir):
    """A new empty directory inside ``data_dir`` to build in, removed afterwards with whatever is left in it;
    those of earlier builds that were killed are removed first."""
    for old in Path(data_dir).glob(STAGING_PREFIX + "*"):
        shutil.rmtree(old, ignore_errors=True)
    path = Path(tempfile.mkdtemp(dir=data_dir, prefix=STAGING_PREFIX))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def publish(staging, data_dir):
    """Move a complete build from ``staging`` into ``data_dir``: the old manifest goes first (from then on the
    directory counts as incomplete), every file is renamed into place, and the new manifest comes last. A build
    that fails before this point leaves the old build untouched and usable."""
    (Path(data_dir) / MANIFEST_NAME).unlink(missing_ok=True)
    for path in sorted(staging.iterdir()):
        if path.name != MANIFEST_NAME:
            os.replace(path, Path(data_dir) / path.name)
    os.replace(staging / MANIFEST_NAME, Path(data_dir) / MANIFEST_NAME)


def build_manifest(options, processor, inputs, downloads, split_reports):
    """The manifest.json of a build (see the module docstring)."""
    return {
        "format": MANIFEST_FORMAT, "dataset": options["dataset"],
        "src_lang": options["src_lang"], "tgt_lang": options["tgt_lang"],
        "vocab_size": processor.get_piece_size(),
        "bpe_model": BPE_MODEL, "bpe_vocab": BPE_VOCAB,
        "special_ids": SPECIAL_IDS,
        "options": options, "inputs": inputs, "downloads": downloads or [],
        "splits": split_reports,
    }


def write_bpe_model(data_dir, train_pairs, vocab_size):
    """Train the joint BPE model on both sides of ``train_pairs``, write bpe.model / bpe.vocab, return it."""
    log(f"training BPE (vocab_size {vocab_size}) on {len(train_pairs)} training pairs")
    model = train_bpe([side for pair in train_pairs for side in pair], vocab_size)
    processor = spm.SentencePieceProcessor(model_proto=model)
    atomic_write_bytes(data_dir / BPE_MODEL, model)
    write_lines(data_dir / BPE_VOCAB, vocab_file_lines(processor))
    return processor


def write_split(data_dir, split, cleaned, pairs, processor, options):
    """Encode and write one split's raw and BPE files; returns its manifest entry.

    ``cleaned`` are all cleaned pairs of the split, ``pairs`` those kept so far (for train: without
    empty pairs and, with --dedup, repeats); length-ratio outliers leave train only with --filter_ratio.
    """
    encoded = list(zip(*(encode_lines(processor, side) for side in unzip_pairs(pairs))))
    outliers = ratio_outliers(pairs, encoded, options["max_ratio"])
    report = {"input_lines": len(cleaned), **count_empty_and_repeated(cleaned), "ratio_outliers": sum(outliers),
              "dropped_empty": 0, "dropped_duplicates": 0, "dropped_ratio": 0}
    if split == "train":
        report["dropped_empty"] = report["empty_pairs"]
        report["dropped_duplicates"] = len(cleaned) - report["empty_pairs"] - len(pairs)
        if options["filter_ratio"]:
            pairs = [pair for pair, outlier in zip(pairs, outliers) if not outlier]
            encoded = [pieces for pieces, outlier in zip(encoded, outliers) if not outlier]
            report["dropped_ratio"] = sum(outliers)
    files = split_files(split)
    for side in SIDES:
        write_lines(data_dir / files[f"raw{side}"], [pair[side - 1] for pair in pairs])
        write_lines(data_dir / files[f"bpe{side}"], [" ".join(pieces[side - 1]) for pieces in encoded])
    return {**files, "lines": len(pairs), **report}


def describe_split(split, report, options):
    """One progress line about what happened to a split."""
    if split != "train":
        return (f"{split}: {report['lines']} pairs kept in order ({report['empty_pairs']} with an empty side, "
                f"{report['duplicate_pairs']} repeated, {report['ratio_outliers']} with length ratio > "
                f"{options['max_ratio']:g})")
    duplicates = "dropped" if options["dedup"] else "kept; --dedup drops them"
    outliers = "dropped" if options["filter_ratio"] else "kept; --filter_ratio drops them"
    return (f"train: {report['lines']} of {report['input_lines']} pairs kept; {report['dropped_empty']} with an "
            f"empty side dropped; {report['duplicate_pairs']} repeated pairs ({duplicates}); "
            f"{report['ratio_outliers']} with length ratio > {options['max_ratio']:g} ({outliers})")


# ----------------------------------------------------------------------------------------------
# Command line

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
        description="Build a data directory (cleaned splits, one joint sentencepiece BPE model with "
                    "<pad>=0 <unk>=1 <s>=2 </s>=3, BPE-segmented splits, manifest.json) from a parallel "
                    "corpus. Side 1 is the source, side 2 the target; 'eval' is the dev split.",
        epilog="Training pairs with an empty side are always dropped; repeated pairs and pairs whose "
               "sides differ in length by more than --max_ratio are only reported unless --dedup / "
               "--filter_ratio is given. Dev and test are never filtered. If a download fails, pass "
               "local copies with --dataset files.")
    parser.add_argument("--dataset", choices=DATASETS, default="numbers",
                        help="numbers: built-in synthetic German->English numbers and dates (offline, default); "
                             "multi30k: Multi30k task 1 de-en (train / val / test_2016_flickr), downloaded; "
                             "iwslt2016: IWSLT 2016 de-en TED talks (dev tst2013, test tst2014), downloaded; "
                             "files: local plain-text files given by --train1 ... --test2")
    parser.add_argument("--data_dir", help="output directory (default data/DATASET)")
    parser.add_argument("--vocab_size", type=int,
                        help="BPE vocabulary size including the 4 special pieces (default 1000 for numbers, "
                             "32000 otherwise); it is an error if the corpus cannot fill it")
    parser.add_argument("--dedup", action="store_true",
                        help="drop repeated (source, target) training pairs, keeping the first "
                             "(default: count and report them only)")
    parser.add_argument("--max_ratio", type=float, default=DEFAULT_MAX_RATIO,
                        help="a pair whose longer side has more than this many times the BPE pieces of "
                             "the shorter side counts as a length-ratio outlier (default %(default)g)")
    parser.add_argument("--filter_ratio", action="store_true",
                        help="drop length-ratio outliers from train (default: report them only)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild --data_dir even if it holds a build with other inputs or options")
    numbers = parser.add_argument_group("--dataset numbers")
    numbers.add_argument("--seed", type=int, help="random seed of the generated corpus (default 1)")
    numbers.add_argument("--n_train", type=int, help="training pairs (default 50000)")
    numbers.add_argument("--n_eval", type=int, help="dev pairs (default 1000)")
    numbers.add_argument("--n_test", type=int, help="test pairs (default 1000)")
    downloads = parser.add_argument_group("--dataset multi30k / iwslt2016 (downloads, cached in DATA_DIR/download)")
    downloads.add_argument("--url", help=f"multi30k: base URL holding train.de.gz ... test_2016_flickr.en.gz "
                                         f"(default {MULTI30K_URL}); iwslt2016: URL of de-en.tgz (default "
                                         f"{IWSLT2016_URL}, which no longer answers, so give a mirror)")
    downloads.add_argument("--no_verify", action="store_true",
                           help="multi30k: accept files whose sha256 differs from the known release "
                                "(the sha256 of every download is recorded in the manifest either way)")
    files = parser.add_argument_group("--dataset files (all six required)")
    for flag in FILE_FLAGS.values():
        split, side = flag[:-1], flag[-1]
        files.add_argument(f"--{flag}", metavar="FILE",
                           help=f"{split} split, {'source' if side == '1' else 'target'} side (UTF-8, one "
                                "sentence per line)")
    files.add_argument("--src_lang", help="source language code for the manifest (default de)")
    files.add_argument("--tgt_lang", help="target language code for the manifest (default en)")
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
    if args.vocab_size is not None and args.vocab_size < 1:
        parser.error("--vocab_size must be positive")
    if args.max_ratio <= 1:
        parser.error("--max_ratio must be greater than 1")


def build_options(args):
    """Every option that shapes the output, with defaults filled in."""
    def given_or(value, default):
        return default if value is None else value

    options = {"dataset": args.dataset,
               "vocab_size": given_or(args.vocab_size, DEFAULT_VOCAB_SIZE[args.dataset]),
               "dedup": args.dedup, "filter_ratio": args.filter_ratio, "max_ratio": args.max_ratio,
               "src_lang": given_or(args.src_lang, "de"), "tgt_lang": given_or(args.tgt_lang, "en")}
    if args.dataset == "numbers":
        options.update(seed=given_or(args.seed, 1), n_train=given_or(args.n_train, 50000),
                       n_eval=given_or(args.n_eval, 1000), n_test=given_or(args.n_test, 1000))
    return options


def load_corpus(args, options, data_dir):
    """(splits, sources, downloads) for the chosen dataset."""
    if args.dataset == "numbers":
        log(f"generating the numbers corpus (seed {options['seed']})")
        splits = numbers_corpus(options["n_train"], options["n_eval"], options["n_test"], options["seed"])
        return splits, {flag: f"numbers corpus, seed {options['seed']}" for flag in FILE_FLAGS.values()}, []
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
    options = build_options(args)
    data_dir = Path(args.data_dir or Path("data") / args.dataset)
    started = time.monotonic()
    try:
        check_data_dir(data_dir)
        splits, sources, downloads = load_corpus(args, options, data_dir)
        manifest = build_data_dir(data_dir, splits, options, sources, downloads, force=args.force)
    except (UserError, OSError) as error:
        report(error)
        return USER_ERROR_EXIT_CODE
    except KeyboardInterrupt:
        print(f"prepro.py: interrupted; {data_dir} has no new manifest, run again to finish", file=sys.stderr)
        return 130
    counts = ", ".join(f"{split} {manifest['splits'][split]['lines']}" for split in SPLITS)
    log(f"done: {data_dir} ({manifest['dataset']}, vocab {manifest['vocab_size']}, {counts} pairs) "
        f"in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
