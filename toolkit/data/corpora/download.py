"""Downloading and unpacking the public corpora (Multi30k task 1, IWSLT 2016 de-en),
cached in DATA_DIR/download.

A download is written atomically beside a record of its URL, so an interrupted one is fetched again;
archives whose members could land outside the extraction directory are refused whole.
"""
import html
import http.client
import re
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from toolkit.base.reading import sha256_bytes, sha256_file
from toolkit.data.corpora import FILE_FLAGS, log, pair_up
from toolkit.base.errors import UserError
from toolkit.base.writing import atomic_write
from toolkit.base.reading import decode_lines, gunzip, read_lines

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
    ("eval", 1): "IWSLT16.TED.tst2013.de-en.de.xml",
    ("eval", 2): "IWSLT16.TED.tst2013.de-en.en.xml",
    ("test", 1): "IWSLT16.TED.tst2014.de-en.de.xml",
    ("test", 2): "IWSLT16.TED.tst2014.de-en.en.xml",
}


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
    recorded = source_record.exists() and source_record.read_text(encoding="utf-8") == url
    if path.exists() and recorded:
        log(f"using cached {path}")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    source_record.unlink(missing_ok=True)
    log(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=path.name,
                      disable=None) as progress:
                chunks = []
                for chunk in iter(lambda: response.read(1 << 16), b""):
                    chunks.append(chunk)
                    progress.update(len(chunk))
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise UserError(f"cannot download {url} ({download_error_reason(error)}); "
                        f"{offline_hint()}") from None
    received = sum(len(chunk) for chunk in chunks)
    if total and received != total:
        raise UserError(f"download of {url} was cut short ({received} of {total} bytes); try again "
                        f"or {offline_hint()}")
    atomic_write(path, b"".join(chunks))
    atomic_write(source_record, url.encode("utf-8"))


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
    except UserError as error:
        discard_download(path)
        raise UserError(f"{error}; the download was removed, try again or "
                        f"{offline_hint()}") from None


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
                    raise UserError(f"refusing to extract {archive}: member {member.name!r} is "
                                    f"unsafe ({reason})")
            target_dir.mkdir(parents=True, exist_ok=True)
            tar.extractall(target_dir, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as error:
        raise UserError(f"cannot extract {archive}: {error}") from None


def find_extracted(root, name, archive):
    """The first file (in sorted order) called ``name`` anywhere below ``root``."""
    matches = sorted(path for path in Path(root).rglob(name) if path.is_file())
    if not matches:
        raise UserError(f"{archive} has no file named {name}; is it the IWSLT 2016 de-en archive "
                        f"(de-en.tgz)?")
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
            raise UserError(f"{url} unpacks to sha256 {sha256_bytes(data)}, expected "
                            f"{MULTI30K_SHA256[name]} "
                            "(Multi30k task 1 raw); the download was removed. If your mirror "
                            "serves another version on purpose, pass --no_verify")
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
    except UserError:
        discard_download(archive)
        shutil.rmtree(extracted, ignore_errors=True)
        raise
    lines, sources = {}, {}
    for (split, side), name in IWSLT2016_FILES.items():
        text = read_lines(find_extracted(extracted, name, url))
        lines[split, side] = strip_markup_lines(text) if split == "train" else xml_segments(text)
        sources[FILE_FLAGS[split, side]] = f"{url}#{name}"
    return pair_up(lines, sources), sources, downloads
