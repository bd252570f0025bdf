"""The data directory that prepro.py writes and training reads: filtering, the joint BPE model, the manifest.

See prepro.py for its layout. A build is written into a staging directory inside the data directory and its
files are renamed into place only once all are complete, manifest.json last.
"""
import contextlib
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import sentencepiece as spm

from corpora import FILE_FLAGS, SIDES, SPLITS, log, unzip_pairs
from errors import UserError
from textio import (SPECIAL_PIECES, atomic_write, clean_line, sha256_bytes, write_json,
                    write_lines)

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.json"
BPE_MODEL = "bpe.model"
BPE_VOCAB = "bpe.vocab"


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
            pad_id=SPECIAL_PIECES["<pad>"], unk_id=SPECIAL_PIECES["<unk>"], bos_id=SPECIAL_PIECES["<s>"],
            eos_id=SPECIAL_PIECES["</s>"], pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            input_sentence_size=0, shuffle_input_sentence=False, num_threads=1, minloglevel=2)
    except RuntimeError as error:
        raise UserError(vocab_size_message(str(error), vocab_size)) from None
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
        raise UserError(f"{path} is unreadable ({error}); pass --force to rebuild {data_dir}") from None


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

    Raises UserError if it holds another build, unless ``force``: then the old build stays usable
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
        raise UserError(f"{data_dir} was built from other inputs or options ({'; '.join(differences)}): "
                        "pass another --data_dir, or --force to rebuild it")
    missing = [name for name in output_files(manifest) if not (Path(data_dir) / name).is_file()]
    if missing:
        log(f"{data_dir} misses {', '.join(missing)}; rebuilding it")
        manifest_path.unlink()
        return False
    return True


def check_data_dir(data_dir):
    """Raise UserError if a file stands where the data directory should be."""
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir} is a file, not a directory")


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
            raise UserError(f"the {name} split is empty ({describe_sides(split, sources)}): train.py scores BLEU on "
                            f"dev and test.py on test; give at least one {name} pair")
    train_pairs = select_training_pairs(cleaned["train"], options["dedup"])
    if not train_pairs:
        raise UserError("no training pairs are left after dropping empty ones; check the train files")
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
        "special_ids": SPECIAL_PIECES,
        "options": options, "inputs": inputs, "downloads": downloads or [],
        "splits": split_reports,
    }


def write_bpe_model(data_dir, train_pairs, vocab_size):
    """Train the joint BPE model on both sides of ``train_pairs``, write bpe.model / bpe.vocab, return it."""
    log(f"training BPE (vocab_size {vocab_size}) on {len(train_pairs)} training pairs")
    model = train_bpe([side for pair in train_pairs for side in pair], vocab_size)
    processor = spm.SentencePieceProcessor(model_proto=model)
    atomic_write(data_dir / BPE_MODEL, model)
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
