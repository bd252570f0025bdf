"""The data directory that prepro.py writes and every other tool reads: its layout, its manifest
(read and written here only), the publishing of a complete build, and the checks a tool makes before
it reads one.

A data directory (default ``data/NAME``) holds::

    manifest.json                 what was built, from what, with which options (written last)
    bpe.model, bpe.vocab          one joint sentencepiece BPE model trained on both sides of train;
                                  bpe.vocab line i is "piece<TAB>score" of id i;
                                  fixed ids <pad>=0, <unk>=1, <s>=2, </s>=3
    train.1 train.2               cleaned text, UTF-8, one sentence per line, '\\n' line endings
    eval.1 eval.2 test.1 test.2
    train.1.bpe ... test.2.bpe    the same lines as sentencepiece pieces joined by single spaces
                                  (an empty line stays empty)
    train.1.ids, train.1.offsets  the same lines as BPE ids, which training
                                  memory-maps (idsfile.py):
    ... test.2.ids, test.2.offsets  uint16 (int32 from 65536 pieces on), and int64 line offsets
    download/                     cached downloads (multi30k, iwslt2016 only)

A build (databuild.py) is written into a staging directory inside the data directory and its files
are renamed into place only once all are complete, manifest.json last, so a directory with a
manifest is complete, and a failed rebuild (--force) leaves the previous build usable.
"""
import contextlib
import json
import os
from pathlib import Path

import numpy as np
import sentencepiece as spm

from toolkit.base.reading import sha256_file
from toolkit.data.corpora import SIDES, SPLITS, log
from toolkit.base.errors import UserError, writing
from toolkit.base.ids import SPECIAL_PIECES
from toolkit.base.ids import ids_dtype, map_file, release_pages
from toolkit.base.writing import exclusive_lock
from toolkit.base.writing import same_file, write_json
from toolkit.base.reading import check_types, iter_lines, loads_json, read_json
import toolkit.base.writing

#: 2: ids files beside the text (idsfile.py); 1: text only (still read, from the .bpe files).
MANIFEST_FORMAT = 2
MANIFEST_NAME = "manifest.json"
BPE_MODEL = "bpe.model"
BPE_VOCAB = "bpe.vocab"


# ----------------------------------------------------------------------------------------------
# The layout, and publishing a build


def split_files(split):
    """File names of one split, as listed in the manifest."""
    return {"raw1": f"{split}.1", "raw2": f"{split}.2", "bpe1": f"{split}.1.bpe",
            "bpe2": f"{split}.2.bpe", "ids1": f"{split}.1.ids", "ids2": f"{split}.2.ids",
            "offsets1": f"{split}.1.offsets", "offsets2": f"{split}.2.offsets"}


def output_files(manifest):
    """Every file a finished data directory must hold, manifest excluded."""
    names = [manifest["bpe_model"], manifest["bpe_vocab"]]
    for split in manifest["splits"].values():
        names += [split[key] for key in split_files("").keys() if key in split]
    return names


def read_manifest(data_dir):
    """The manifest of ``data_dir`` as a dict, or None if there is none: how a build tells whether
    the directory already holds it. The tools that read a data dir call load_manifest."""
    path = Path(data_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return loads_json(path.read_text(encoding="utf-8-sig"))
    except (ValueError, OSError) as error:
        raise UserError(f"{path} is unreadable ({error}); pass --force to rebuild "
                        f"{data_dir}") from None


def build_differences(manifest, options, inputs):
    """What differs between an existing build and the requested one, as short phrases."""
    differences = []
    old_options = manifest.get("options", {})
    for key in sorted(set(old_options) | set(options)):
        if old_options.get(key) != options.get(key):
            differences.append(f"{key} {old_options.get(key)!r} -> {options.get(key)!r}")
    old_inputs = manifest.get("inputs", {})
    for flag in inputs:
        if old_inputs.get(flag, {}).get("sha256") != inputs[flag]["sha256"]:
            differences.append(f"{flag} content changed")
    return differences


def older_format_message(data_dir, manifest):
    """The line that refuses to reuse a data dir written by an older prepro.py."""
    return (f"{data_dir} was written by an older prepro.py (manifest format "
            f"{manifest.get('format')}, now {MANIFEST_FORMAT}): re-run prepro.py with --force to "
            f"rebuild it")


def is_up_to_date(data_dir, options, inputs, force):
    """True if ``data_dir`` already holds this exact build.

    Raises UserError if it holds another build or one of an older format, unless ``force``: then the
    old build stays usable until the new one is complete (see publish).
    """
    if force:
        return False
    manifest = read_manifest(data_dir)
    if manifest is None or manifest == PUBLISHING:  # none, or a build stopped while published
        return False
    if manifest.get("format") != MANIFEST_FORMAT:
        raise UserError(older_format_message(data_dir, manifest))
    differences = build_differences(manifest, options, inputs)
    if differences:
        raise UserError(f"{data_dir} was built from other inputs or options "
                        f"({'; '.join(differences)}): "
                        "pass another --data_dir, or --force to rebuild it")
    missing = [name for name in output_files(manifest) if not (Path(data_dir) / name).is_file()]
    if missing:
        log(f"{data_dir} misses {', '.join(missing)}; rebuilding it")
        return False
    return True


def check_data_dir(data_dir):
    """Raise UserError if a file stands where the data directory should be."""
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir} is a file, not a directory")


def build_files():
    """The names of the files a build writes in a data dir."""
    return [MANIFEST_NAME, BPE_MODEL, BPE_VOCAB] + [name for split in SPLITS for name
                                                    in split_files(split).values()]


def check_inputs_kept(data_dir, inputs):
    """Refuses input files ({flag: path or None}) that a build of ``data_dir`` would replace (a
    corpus's train.1 ... test.2 kept in the data dir itself): an input is never an output."""
    for flag, path in inputs.items():
        replaced = next((name for name in build_files() if path
                         and same_file(path, Path(data_dir) / name)), None)
        if replaced:
            raise UserError(f"--{flag} {path} is {Path(data_dir) / replaced}, a file that "
                            f"prepro.py writes in --data_dir {data_dir}: move the corpus out of "
                            f"{data_dir}, or pass another --data_dir")


def check_build_owned(data_dir):
    """Refuses a data_dir that holds files under the names a build writes but no manifest.json
    (prepro.py's, even while it publishes a build): prepro.py did not write them, and a build,
    --force or not, would replace them."""
    if os.path.lexists(Path(data_dir) / MANIFEST_NAME):
        return
    found = [name for name in build_files() if os.path.lexists(Path(data_dir) / name)]
    if found:
        raise UserError(f"--data_dir {data_dir} holds {', '.join(found[:3])}"
                        f"{' and more' if len(found) > 3 else ''} but no {MANIFEST_NAME}, so "
                        f"prepro.py did not write them and will not replace them: move them, "
                        f"or pass another --data_dir")


#: Prefix of the directory inside --data_dir where a build is written before publish moves
#: it into place.
STAGING_PREFIX = ".build-"


@contextlib.contextmanager
def staging_dir(data_dir):
    """A new empty directory inside ``data_dir`` to build in (toolkit.base.writing.staging_dir:
    those of killed builds are removed first), while this process holds the data dir's lock: a
    second prepro.py on it is refused at once, and never removes the staging of the first. A full
    disk is a line naming data_dir and its free space."""
    busy = (f"{data_dir} is being built by another prepro.py: wait for it to end, stop it, or pass "
            "another --data_dir")
    with exclusive_lock(str(data_dir), None, lambda holder: busy), writing(data_dir), \
            toolkit.base.writing.staging_dir(data_dir, STAGING_PREFIX) as path:
        yield path


#: The manifest of a data dir while a build is moved into it: incomplete, and prepro.py's.
PUBLISHING = {"publishing": True}


def publish(staging, data_dir, manifest):
    """Move a complete build from ``staging`` into ``data_dir`` under ``manifest``: the old manifest
    is replaced by PUBLISHING first (from then on the directory counts as incomplete, and as
    prepro.py's), every file is renamed into place, and the new manifest comes last. A build that
    fails before this point leaves the old build untouched and usable."""
    write_json(staging / MANIFEST_NAME, manifest)
    write_json(Path(data_dir) / MANIFEST_NAME, PUBLISHING)
    for path in sorted(staging.iterdir()):
        if path.name != MANIFEST_NAME:
            os.replace(path, Path(data_dir) / path.name)
    os.replace(staging / MANIFEST_NAME, Path(data_dir) / MANIFEST_NAME)


def build_manifest(options, processor, inputs, downloads, split_reports, bpe_training):
    """The manifest.json of a build (see the module docstring and docs/data.md)."""
    return {
        "format": MANIFEST_FORMAT, "dataset": options["dataset"],
        "src_lang": options["src_lang"], "tgt_lang": options["tgt_lang"],
        "vocab_size": processor.get_piece_size(),
        "bpe_model": BPE_MODEL, "bpe_vocab": BPE_VOCAB, "bpe_training": bpe_training,
        "ids_dtype": ids_dtype(processor.get_piece_size()).name,
        "special_ids": SPECIAL_PIECES,
        "options": options, "inputs": inputs, "downloads": downloads or [],
        "splits": split_reports,
    }


# ----------------------------------------------------------------------------------------------
# Reading a data directory


def load_manifest(data_dir, trained_data_dir=None, logdir=None, splits=()):
    """Reads the manifest of data_dir, written last by prepro.py, and checks the files of the data
    dir that a tool reads (check_files): its sentencepiece model and the files of `splits`.
    trained_data_dir and logdir (a trained model's) make the message for a missing one say where a
    relative data dir was looked for."""
    fpath = os.path.join(data_dir, MANIFEST_NAME)
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise UserError("--data_dir %s is a file, not a directory: pass the directory that "
                        "prepro.py wrote" % data_dir)
    if not os.path.exists(fpath):
        if data_dir == trained_data_dir and not os.path.isabs(data_dir):
            raise UserError("%s not found from %s: the data dir %s in %s/hparams.json is relative "
                            "to the directory train.py ran in; run from there, or pass --data_dir"
                            % (fpath, os.getcwd(), data_dir,
                                                                                     logdir))
        raise UserError("%s not found: run `python prepro.py --data_dir %s` first"
                        % (fpath, data_dir))
    manifest = read_json(fpath, "it was damaged; rebuild the data dir with `python prepro.py "
                                "--data_dir %s --force` and the options it was built "
                                "with" % data_dir)
    if manifest == PUBLISHING:
        raise damaged(data_dir, "%s was being built when prepro.py stopped" % data_dir)
    if not isinstance(manifest, dict) or "splits" not in manifest:
        raise UserError("%s is not a manifest written by prepro.py: rebuild the data dir with "
                        "`python prepro.py --data_dir %s --force`" % (fpath, data_dir))
    check_manifest_types(data_dir, fpath, manifest)
    check_fixed_values(data_dir, fpath, manifest)
    check_names(data_dir, fpath, manifest)
    check_files(data_dir, manifest, splits)
    return manifest


#: The languages of a data dir built without --src_lang / --tgt_lang, or before they were recorded.
DEFAULT_LANGUAGES = {"src_lang": "de", "tgt_lang": "en"}


def languages(recorded):
    """(source, target): the language codes of a manifest, or of an export's settings, that
    recorded them (a dict); DEFAULT_LANGUAGES' where it did not."""
    return tuple(recorded.get(key, default) for key, default in DEFAULT_LANGUAGES.items())


#: The types of a manifest's values (the names of its files are check_names's), and of a split's.
MANIFEST_SCHEMA = {"format": int, "dataset": str, "src_lang": str, "tgt_lang": str,
                   "vocab_size": int, "ids_dtype": str, "splits": dict, "options": dict,
                   "inputs": dict}
SPLIT_SCHEMA = {"lines": int}


def check_manifest_types(data_dir, fpath, manifest):
    """Refuses a manifest (read from fpath) whose values, or its splits' line counts, have another
    type than prepro.py writes (a hand edit)."""
    remedy = "rebuild the data dir with `python prepro.py --data_dir %s --force`" % data_dir
    check_types(manifest, MANIFEST_SCHEMA, fpath, remedy)
    check_types(manifest["splits"], dict.fromkeys(manifest["splits"], dict), fpath, remedy,
                "splits.")
    for split, entry in manifest["splits"].items():
        check_types(entry, SPLIT_SCHEMA, fpath, remedy, "splits.%s." % split)


def check_fixed_values(data_dir, fpath, manifest):
    """Refuses a manifest whose values that follow from the build are not what prepro.py writes:
    the special pieces' ids, fixed for every data dir, and the ids' dtype, fixed by the
    vocabulary's size (a hand edit would make every tool misread the ids)."""
    expected = {"special_ids": SPECIAL_PIECES}
    if "ids_dtype" in manifest:
        expected["ids_dtype"] = ids_dtype(manifest["vocab_size"]).name
    for key, value in expected.items():
        if key in manifest and manifest[key] != value:
            raise UserError("%s: %s is %s, but prepro.py writes %s for this data dir: rebuild it "
                            "with `python prepro.py --data_dir %s --force`"
                            % (fpath, key, json.dumps(manifest[key])[:80], json.dumps(value),
                               data_dir))


def check_names(data_dir, fpath, manifest):
    """Refuses a manifest (read from fpath) whose files are not plain names inside data_dir (an
    absolute path, a directory above it): paths in metadata stay inside their directory."""
    names = [(key, manifest.get(key)) for key in ("bpe_model", "bpe_vocab")]
    names += [("splits.%s.%s" % (split, key), entry[key]) for split,
              entry in manifest["splits"].items() for key in split_files(split) if key in entry]
    for key, name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name:
            raise UserError("%s: %s is %s, not the name of a file inside %s: rebuild the data dir "
                            "with `python prepro.py --data_dir %s --force`"
                            % (fpath, key, json.dumps(name), data_dir, data_dir))


def has_ids(manifest):
    """Whether the data dir has ids files (format 2); one of format 1 has its splits' ids as .bpe
    text only."""
    return manifest.get("format", 1) >= 2


def split_paths(data_dir, manifest, split):
    """The paths of a split's files that the manifest lists: {key of split_files: path}."""
    entry = manifest["splits"][split]
    return {key: os.path.join(data_dir, entry[key]) for key in split_files(split) if key in entry}


def bpe_model_path(data_dir, manifest):
    """The path of the data dir's sentencepiece model, which segments text into
    the vocabulary's pieces."""
    return os.path.join(data_dir, manifest["bpe_model"])


def bpe_vocab_path(data_dir, manifest):
    """The path of the data dir's BPE vocabulary file (line i: "piece<TAB>score" of id i)."""
    return os.path.join(data_dir, manifest["bpe_vocab"])


def fingerprint(data_dir, manifest):
    """What ties a model to the data dir it was trained on, as recorded in hparams.json: vocab_size,
    vocab_sha256 (of its BPE vocabulary: two vocabularies of the same size can still differ),
    bpe_sha256 (of its sentencepiece model) and its direction, src_lang and tgt_lang (prepro.py
    --reverse builds the other direction with the same vocabulary)."""
    source, target = languages(manifest)
    return {"vocab_size": manifest["vocab_size"],
            "vocab_sha256": sha256_file(bpe_vocab_path(data_dir, manifest)),
            "bpe_sha256": sha256_file(bpe_model_path(data_dir, manifest)),
            "src_lang": source, "tgt_lang": target}


def check_vocab(hp, manifest, trained_data_dir):
    """A model can only read a data dir whose vocabulary and sentencepiece model it was trained
    with: same size and, where hparams.json records them (vocab_sha256, bpe_sha256: older logdirs
    lack the latter), the same files. The data dir's own bpe.model and bpe.vocab agree with each
    other (check_files), so an older logdir whose data dir had its bpe.model swapped
    is refused too."""
    remedy = other_vocab_remedy(hp, trained_data_dir)
    if manifest["vocab_size"] != hp.vocab_size:
        raise UserError("vocab size %d of %s does not match vocab size %d of the model in %s: %s"
                        % (manifest["vocab_size"], hp.data_dir, hp.vocab_size, hp.logdir, remedy))
    found = fingerprint(hp.data_dir, manifest)
    for key, what in (("vocab_sha256", "BPE vocabulary (%s)" % manifest["bpe_vocab"]),
                      ("bpe_sha256", "sentencepiece model (%s)" % manifest["bpe_model"])):
        if getattr(hp, key, None) not in (None, found[key]):
            raise UserError("the %s of %s is not the one the model in %s was trained with, "
                            "although the vocabulary has its size %d: %s"
                            % (what, hp.data_dir, hp.logdir, hp.vocab_size, remedy))
    check_direction(hp, found, trained_data_dir)


def check_direction(hp, found, trained_data_dir):
    """A model reads a data dir of its own direction only (its references and the languages its
    sentences are split by), where hparams.json records it (src_lang, tgt_lang: older logdirs lack
    them). found: the data dir's fingerprint."""
    model = (getattr(hp, "src_lang", None), getattr(hp, "tgt_lang", None))
    given = (found["src_lang"], found["tgt_lang"])
    if None in model or model == given:
        return
    if same_file(hp.data_dir, trained_data_dir):
        remedy = ("it is the data dir it was trained on, rebuilt since (prepro.py --force) in "
                  "another direction: rebuild it as it was built then")
    else:
        remedy = ("pass the --data_dir it was trained on (%s), or one built in its direction"
                  % trained_data_dir)
    raise UserError("the data dir %s translates %s->%s (its %s) but the model in %s translates "
                    "%s->%s: %s" % (hp.data_dir, *given, MANIFEST_NAME, hp.logdir, *model,
                                    remedy))


def other_vocab_remedy(hp, trained_data_dir):
    """What to do about a data dir whose vocabulary is not the model's: pass the one it was trained
    on or, when that is the one given (rebuilt since by prepro.py --force), rebuild it as it was."""
    if not same_file(hp.data_dir, trained_data_dir):
        return ("pass the --data_dir it was trained on (%s), or rebuild this one as it was built "
                "then" % trained_data_dir)
    return ("%s is the data dir it was trained on, rebuilt since (prepro.py --force) with another "
            "vocabulary: the model's vocabulary is gone; rebuild it from the same corpus and "
            "options as then" % hp.data_dir)


# ----------------------------------------------------------------------------------------------
# Checking a data directory before it is used


#: Ids checked at a time for their range (their pages are handed back after each chunk:
#: idsfile.release_pages).
RANGE_CHECK_IDS = 1 << 24


def damaged(data_dir, what):
    """The UserError for a data dir whose file is missing or damaged: what is wrong,
    and to rebuild it."""
    return UserError(f"{what}: the data dir is damaged; rebuild it with `python prepro.py "
                     f"--data_dir {data_dir} "
                     "--force` and the options it was built with")


def count_lines(path):
    """The lines of a text file as read_lines counts them (a last line without '\\n' counts), read
    in chunks."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
    return count + (last != b"\n")


def check_files(data_dir, manifest, splits):
    """Refuses, with one line naming the file and saying to rebuild with prepro.py --force, a data
    dir whose sentencepiece model is missing, unreadable or not the one of its bpe.vocab, or where a
    file of one of ``splits`` is missing, holds another number of lines than the manifest says (each
    side, the references too) or ids outside the vocabulary. Tools call it before any work: a
    mismatch found at the end would cost the run."""
    data_dir = Path(data_dir)
    files = [manifest["bpe_model"], manifest["bpe_vocab"]]
    keys = ("raw1", "raw2") + (("ids1", "offsets1", "ids2", "offsets2") if has_ids(manifest)
                               else ("bpe1", "bpe2"))
    files += [manifest["splits"][split][key] for split in splits for key in keys]
    for name in files:
        if not (data_dir / name).is_file():
            raise damaged(data_dir, f"{data_dir / name} is missing")
    check_bpe_model(data_dir, manifest)
    for split in splits:
        check_split(data_dir, manifest, split)


def check_bpe_model(data_dir, manifest):
    """bpe.model loads, and its pieces are those of bpe.vocab
    (the vocabulary the model's ids index)."""
    model_path, vocab_path = data_dir / manifest["bpe_model"], data_dir / manifest["bpe_vocab"]
    try:
        processor = spm.SentencePieceProcessor(model_file=str(model_path))
    except (RuntimeError, OSError) as error:
        raise damaged(data_dir, f"{model_path} is not a sentencepiece model "
                                f"({str(error).splitlines()[0][:100]})")
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    if pieces != [line.split("\t")[0] for line in iter_lines(vocab_path)]:
        raise damaged(data_dir, f"{model_path} does not hold the pieces of {vocab_path} (another "
                                f"corpus's model?)")


def check_split(data_dir, manifest, split):
    """Every side of a split, and its references, has the manifest's number of lines;
    ids are in range."""
    entry, expected = manifest["splits"][split], manifest["splits"][split]["lines"]
    counts = {}
    for side in SIDES:
        if has_ids(manifest):
            offsets = entry[f"offsets{side}"]
            counts[offsets] = (data_dir / offsets).stat().st_size // 8 - 1
            check_ids_range(data_dir, data_dir / entry[f"ids{side}"], manifest)
        else:
            counts[entry[f"bpe{side}"]] = count_lines(data_dir / entry[f"bpe{side}"])
        if split != "train":  # train's text is not read by training, and may be large
            counts[entry[f"raw{side}"]] = count_lines(data_dir / entry[f"raw{side}"])
    wrong = {name: count for name, count in counts.items() if count != expected}
    if wrong:
        found = ", ".join(f"{name} {count}" for name, count in counts.items())
        raise damaged(data_dir, f"the {split} split of {data_dir} should have {expected} lines in "
                                f"each file ({MANIFEST_NAME}) but has: {found}")


def check_ids_range(data_dir, path, manifest):
    """Every id of an .ids file is below the vocabulary's size."""
    size, dtype = path.stat().st_size, np.dtype(manifest["ids_dtype"])
    if size % dtype.itemsize:
        raise damaged(data_dir, f"{path} holds {size} bytes, not a whole number of "
                                f"{dtype.name} ids")
    ids = map_file(path, dtype) if size else []
    for start in range(0, len(ids), RANGE_CHECK_IDS):
        chunk = ids[start:start + RANGE_CHECK_IDS]
        if int(chunk.max()) >= manifest["vocab_size"] or int(chunk.min()) < 0:
            raise damaged(data_dir, f"{path} holds ids outside the vocabulary's "
                                    f"{manifest['vocab_size']} pieces")
        release_pages(chunk)
