"""Building a data directory from a corpus, split by split: cleaning, the joint BPE model, and the
text, BPE text and ids files of each split.

prepro.py calls build_data_dir; datadir.py owns the directory itself (its layout, its manifest, the
staging directory a build is written in and the publishing of a complete build).
"""
import array
import contextlib
import dataclasses
import hashlib
import io
import itertools
import os
import re
from pathlib import Path

import numpy as np
import sentencepiece as spm

from toolkit.data.corpora import FILE_FLAGS, SIDES, SPLITS, check_same_length, log
from toolkit.data.datadir import (BPE_MODEL, BPE_VOCAB, build_manifest, check_data_dir,
                                  is_up_to_date, publish, read_manifest, split_files, staging_dir)
from toolkit.base.reading import sha256_bytes
from toolkit.base.errors import UserError
from toolkit.base.ids import SPECIAL_PIECES, UNK_ID
from toolkit.base.ids import IdsWriter, ids_dtype
from toolkit.base.writing import atomic_write, line_writer, write_lines
from toolkit.base.reading import clean_line, iter_lines

#: BPE is trained on a random sample of this many sentences (both sides) of train when it has more.
BPE_SAMPLE_SENTENCES = 2_000_000
#: Lines encoded at a time (by every core): memory holds one chunk of a split, never the split.
CHUNK_LINES = 100_000
#: A pass over a split reports its progress every this many lines.
PROGRESS_LINES = 1_000_000


def progress(lines, what):
    """Yield each item of ``lines``, logging "WHAT: N lines" every PROGRESS_LINES of them."""
    for count, line in enumerate(lines, 1):
        if count % PROGRESS_LINES == 0:
            log(f"{what}: {count} lines")
        yield line


def is_empty_pair(source, target):
    """A pair is empty when either side has no text."""
    return not source or not target


def pair_hash(source, target):
    """A 64-bit hash of a pair, to count repeats without holding the pairs (two different pairs
    share one with a chance of about n^2 / 2^65 among n pairs: 1 in a million
    for 4.5 million pairs)."""
    digest = hashlib.blake2b(f"{source}\n{target}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def first_occurrences(hashes):
    """(n,) bool: whether each pair (by hash) is the first of its kind; their count is
    n minus the repeats."""
    first = np.zeros(len(hashes), bool)
    first[np.unique(np.asarray(hashes, np.uint64), return_index=True)[1]] = True
    return first


def length_ratios(lengths1, lengths2):
    """How many times longer the longer side is than the shorter (in BPE pieces), for each pair:
    (n,) float."""
    return np.maximum(lengths1, lengths2) / np.maximum(np.minimum(lengths1, lengths2), 1)


# ----------------------------------------------------------------------------------------------
# BPE


def train_bpe(sentences, vocab_size, sample_size=0):
    """Train the joint BPE model on the iterable ``sentences``; returns the serialized model.

    sample_size 0 reads every sentence in order, with one thread; otherwise a random sample of
    sample_size sentences, drawn with a fixed seed as the sentences stream by (memory holds the
    sample only), with every core. Both are deterministic. bpe.model records the thread count: one
    thread for a corpus below the sample size keeps its bpe.model the same on every machine.
    """
    model = io.BytesIO()
    spm.set_random_generator_seed(1)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type="bpe",
            vocab_size=vocab_size, character_coverage=1.0, normalization_rule_name="identity",
            pad_id=SPECIAL_PIECES["<pad>"], unk_id=SPECIAL_PIECES["<unk>"],
            bos_id=SPECIAL_PIECES["<s>"], eos_id=SPECIAL_PIECES["</s>"], pad_piece="<pad>",
            unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", input_sentence_size=sample_size,
            shuffle_input_sentence=sample_size > 0, num_threads=os.cpu_count() if sample_size
            else 1, minloglevel=2)
    except RuntimeError as error:
        raise UserError(vocab_size_message(str(error), vocab_size)) from None
    return model.getvalue()


@dataclasses.dataclass(frozen=True)
class BpeModel:
    """A sentencepiece model to segment with instead of training one (prepro.py --bpe_model): its
    bytes, its number of pieces, the sha256 of its bytes and where it was read from."""
    proto: bytes
    size: int
    sha256: str
    path: str


def read_bpe_model(path):
    """The sentencepiece model at path as a BpeModel; a UserError when it is missing, unreadable, or
    has other special pieces than prepro.py gives its models (toolkit.base.ids.SPECIAL_PIECES)."""
    try:
        with open(path, "rb") as f:
            proto = f.read()
        processor = spm.SentencePieceProcessor(model_proto=proto)
    except OSError as error:
        raise UserError(f"cannot read --bpe_model {path}: {error.strerror}; pass the bpe.model of "
                        f"a data dir") from None
    except RuntimeError:
        raise UserError(f"--bpe_model {path} is not a sentencepiece model: pass the bpe.model of a "
                        f"data dir") from None
    if any(processor.id_to_piece(i) != piece for piece, i in SPECIAL_PIECES.items()):
        raise UserError(f"--bpe_model {path} does not have the special pieces of prepro.py's "
                        f"models (ids "
                        f"{', '.join(f'{i} {piece}' for piece, i in SPECIAL_PIECES.items())}): "
                        f"pass the bpe.model of "
                        "a data dir")
    return BpeModel(proto, processor.get_piece_size(), sha256_bytes(proto), str(path))


def vocab_file_lines(processor):
    """The lines of a sentencepiece .vocab file: "piece<TAB>score" for ids 0, 1, 2, ..."""
    return [f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}" for i
            in range(processor.get_piece_size())]


def vocab_size_message(error_text, vocab_size):
    """Turn sentencepiece's training error into one line that says what to change."""
    too_high = re.search(r"value <= (\d+)", error_text)
    if too_high:
        return (f"--vocab_size {vocab_size} is too large for this training corpus: "
                f"use --vocab_size {too_high.group(1)} or less")
    too_small = re.search(r"required_chars\. (\d+) vs (\d+)", error_text)
    if too_small:
        return (f"--vocab_size {vocab_size} is smaller than the {too_small.group(2)} pieces this "
                f"corpus needs (characters plus 4 special ids): use --vocab_size "
                f"{too_small.group(2)} or more")
    return f"sentencepiece could not train the BPE model: {error_text.splitlines()[-1]}"


def encode_chunk(processor, lines, pieces):
    """The BPE ids of each line (lists of int; an empty line has none) and the lines as pieces
    joined by spaces, encoded by every core. pieces: the vocabulary's pieces by id; a line with
    <unk> (a character the sample did not see) is segmented again to keep its own pieces
    in the text."""
    ids = processor.encode(lines, out_type=int, num_threads=os.cpu_count())
    texts = [" ".join(processor.encode(line, out_type=str)) if UNK_ID in line_ids else
             " ".join([pieces[i] for i in line_ids]) for line, line_ids in zip(lines, ids)]
    return ids, texts


# ----------------------------------------------------------------------------------------------
# Building


def describe_side(lines):
    """(number of lines, hex sha256 of the lines joined by '\\n'), reading the lines once."""
    digest, count = hashlib.sha256(), 0
    for count, line in enumerate(lines, 1):
        digest.update(b"\n" + line.encode("utf-8") if count > 1 else line.encode("utf-8"))
    return count, digest.hexdigest()


def describe_inputs(splits, sources):
    """{flag: {"source": where it came from, "sha256": of its lines joined by '\\n'}} for each side,
    and {split: pairs}, reading every side once. Raises UserError if the two sides of a split differ
    in length."""
    inputs, counts = {}, {}
    for split in SPLITS:
        for side in SIDES:
            flag = FILE_FLAGS[split, side]
            counts[split,
                   side], sha256 = describe_side(progress(splits[split][side - 1], f"reading "
                                                          f"--{flag}"))
            inputs[flag] = {"source": sources.get(flag, "in memory"), "sha256": sha256}
        check_same_length(counts[split, 1], counts[split, 2],
                          sources.get(FILE_FLAGS[split, 1], "side 1"),
                          sources.get(FILE_FLAGS[split, 2], "side 2"))
    return inputs, {split: counts[split, 1] for split in SPLITS}


def build_data_dir(data_dir, splits, options, sources=None, downloads=None, force=False,
                   chunk_lines=CHUNK_LINES, sample_sentences=BPE_SAMPLE_SENTENCES, bpe_model=None):
    """Write a complete data directory from a corpus and return its manifest.

    ``splits`` maps train/eval/test to (source_lines, target_lines) of raw text, each re-iterable
    (a list or corpora.LinesOf: they are streamed, never held); ``options`` must hold dataset,
    vocab_size, dedup, filter_ratio, max_ratio, src_lang and tgt_lang plus any other option that
    shaped the input; ``sources`` names where each side came from (keys train1 ... test2).
    chunk_lines: lines encoded at a time; sample_sentences: see BPE_SAMPLE_SENTENCES;
    bpe_model: a BpeModel to segment with instead of training one. Does nothing if ``data_dir``
    already holds the same build.
    """
    data_dir = Path(data_dir)
    check_data_dir(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    inputs, counts = describe_inputs(splits, sources or {})
    if is_up_to_date(data_dir, options, inputs, force):
        log(f"{data_dir} is up to date (same inputs and options); nothing to do")
        return read_manifest(data_dir)
    for split in ("eval", "test"):
        if not counts[split]:
            name = "dev" if split == "eval" else "test"
            raise UserError(f"the {name} split is empty ({describe_sides(split, sources)}): "
                            f"train.py scores BLEU on dev and test.py on test; give at least one "
                            f"{name} pair")
    with staging_dir(data_dir) as staging:
        cleaned = {split: clean_split(staging, split, *splits[split], options["dedup"]) for split
                   in SPLITS}
        check_cleaned(cleaned, sources)
        processor, bpe_training = write_bpe_model(staging, cleaned["train"], options["vocab_size"],
                                                  sample_sentences, bpe_model)
        split_reports = {}
        for split in SPLITS:
            split_reports[split] = write_split(staging, split, cleaned[split], processor, options,
                                               chunk_lines)
            log(describe_split(split, split_reports[split], options))
        manifest = build_manifest(options, processor, inputs, downloads, split_reports,
                                  bpe_training)
        publish(staging, data_dir, manifest)
    return manifest


def check_cleaned(cleaned, sources):
    """Refuses splits that cleaning left without a usable pair (a dev or test split of blank lines
    would score BLEU on nothing), and warns about splits whose target repeats the source on most
    lines (the same file given twice, or an untranslated corpus)."""
    if not cleaned["train"].keep.any():
        raise UserError("no training pairs are left after dropping empty ones; check the train "
                        "files")
    for split in ("eval", "test"):
        if cleaned[split].empty_pairs == cleaned[split].input_lines:
            name = "dev" if split == "eval" else "test"
            raise UserError(f"every pair of the {name} split has a blank side "
                            f"({describe_sides(split, sources)}): there is nothing to score BLEU "
                            f"on; give {name} files with text on both sides")
    for split in SPLITS:
        clean = cleaned[split]
        pairs = clean.input_lines - clean.empty_pairs
        if pairs and clean.identical_pairs > IDENTICAL_SHARE * pairs:
            log(f"warning: the target is identical to the source in {clean.identical_pairs} of the "
                f"{pairs} {split} pairs ({describe_sides(split, sources)}): is one file given for "
                f"both sides?")


#: The share of a split's pairs with target == source above which prepro warns (see check_cleaned).
IDENTICAL_SHARE = 0.5


def describe_sides(split, sources):
    """Where the two sides of a split came from, for messages: "--eval1 a.de, --eval2 a.en"."""
    return ", ".join(f"--{FILE_FLAGS[split, side]} "
                     f"{(sources or {}).get(FILE_FLAGS[split, side], '?')}" for side in SIDES)


@dataclasses.dataclass
class CleanSplit:
    """A split cleaned into two staging files (clean1, clean2) in step, and what cleaning found:
    input_lines, empty_pairs, duplicate_pairs, identical_pairs (target == source), and keep,
    (lines,) bool: the lines that stay (all but repeats with --dedup)."""
    clean1: Path
    clean2: Path
    input_lines: int
    empty_pairs: int
    duplicate_pairs: int
    identical_pairs: int
    keep: np.ndarray

    def pairs(self):
        """The kept (source, target) pairs, read from the staging files."""
        return itertools.compress(zip(iter_lines(self.clean1), iter_lines(self.clean2)), self.keep)


def clean_split(staging, split, lines1, lines2, dedup):
    """Clean a split line by line into staging/SPLIT.clean.1 and .2 (see
    toolkit.base.reading.clean_line). Train leaves out pairs with an empty side, and with ``dedup``
    keeps the first of repeated pairs only. Returns a CleanSplit."""
    clean1, clean2 = staging / f"{split}.clean.1", staging / f"{split}.clean.2"
    hashes, empty, lines, identical = array.array("Q"), 0, 0, 0
    with line_writer(clean1) as write1, line_writer(clean2) as write2:
        for lines, (source, target) in enumerate(progress(zip(lines1, lines2), f"cleaning {split}"),
                                                 1):
            source, target = clean_line(source), clean_line(target)
            if is_empty_pair(source, target):
                empty += 1
                if split == "train":
                    continue
            else:
                hashes.append(pair_hash(source, target))
                identical += source == target
            write1(source)
            write2(target)
    first = first_occurrences(hashes)
    written = lines - empty if split == "train" else lines
    keep = first if split == "train" and dedup else np.ones(written, bool)
    return CleanSplit(clean1, clean2, lines, empty, len(hashes) - int(first.sum()), identical, keep)


def write_bpe_model(data_dir, train, vocab_size, sample_sentences, bpe_model=None):
    """Train the joint BPE model on both sides of the kept pairs of ``train`` (a CleanSplit), on a
    sample of sample_sentences sentences if there are more, or take bpe_model's (a BpeModel) as it
    is, and write bpe.model / bpe.vocab (the same bytes as bpe_model's data dir has, so that its
    fingerprint is the same).
    Returns the processor and the manifest's "bpe_training": {"sentences": of train, "sample": or
    None, and with bpe_model "reused": its path}."""
    sentences = 2 * int(train.keep.sum())
    sample = sample_sentences if sentences > sample_sentences and not bpe_model else 0
    if bpe_model:
        log(f"segmenting with --bpe_model {bpe_model.path} (vocab_size {bpe_model.size}); no BPE "
            f"training")
        model = bpe_model.proto
    else:
        log(f"training BPE (vocab_size {vocab_size}) on {sentences // 2} training pairs"
            + (f", a random sample of {sample} of their {sentences} sentences" if sample else ""))
        model = train_bpe((side for pair in train.pairs() for side in pair), vocab_size, sample)
    processor = spm.SentencePieceProcessor(model_proto=model)
    atomic_write(data_dir / BPE_MODEL, model)
    write_lines(data_dir / BPE_VOCAB, vocab_file_lines(processor))
    reused = {"reused": bpe_model.path} if bpe_model else {}
    return processor, {"sentences": sentences, "sample": sample or None, **reused}


def chunks(iterable, size):
    """Lists of up to ``size`` consecutive items of ``iterable``."""
    iterator = iter(iterable)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def write_split(data_dir, split, clean, processor, options, chunk_lines=CHUNK_LINES):
    """Encode the kept pairs of a CleanSplit, chunk_lines at a time, and write the split's text, BPE
    text and ids files; returns its manifest entry. Length-ratio outliers leave train
    only with --filter_ratio."""
    files = split_files(split)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    dtype = ids_dtype(processor.get_piece_size())
    lines = outliers = dropped_ratio = 0
    with contextlib.ExitStack() as stack:
        write = {key: stack.enter_context(line_writer(data_dir / files[key]))
                 for key in ("raw1", "raw2", "bpe1", "bpe2")}
        writers = [IdsWriter(data_dir / files[f"ids{side}"], data_dir / files[f"offsets{side}"],
                             dtype)
                   for side in SIDES]
        for writer in writers:
            stack.callback(writer.close)
        for chunk in chunks(progress(clean.pairs(), f"encoding {split}"), chunk_lines):
            texts = list(zip(*chunk))
            encoded = [encode_chunk(processor, list(side_texts), pieces) for side_texts in texts]
            lengths = [np.array([len(ids) for ids in side_ids], np.int64) for side_ids,
                       _ in encoded]
            nonempty = np.array([not is_empty_pair(*pair) for pair in chunk], bool)
            outlier = nonempty & (length_ratios(*lengths) > options["max_ratio"])
            outliers += int(outlier.sum())
            kept = np.ones(len(chunk), bool)
            if split == "train" and options["filter_ratio"]:
                kept, dropped_ratio = ~outlier, dropped_ratio + int(outlier.sum())
            for side, (side_ids, side_pieces) in zip(SIDES, encoded):
                for raw, bpe in itertools.compress(zip(texts[side - 1], side_pieces), kept):
                    write[f"raw{side}"](raw)
                    write[f"bpe{side}"](bpe)
                writers[side - 1].write(list(itertools.compress(side_ids, kept)))
            lines += int(kept.sum())
    clean.clean1.unlink()
    clean.clean2.unlink()
    duplicates = clean.duplicate_pairs if options["dedup"] and split == "train" else 0
    report = {"input_lines": clean.input_lines, "empty_pairs": clean.empty_pairs,
              "duplicate_pairs": clean.duplicate_pairs, "ratio_outliers": outliers,
              "dropped_empty": clean.empty_pairs if split == "train" else 0,
              "dropped_duplicates": duplicates, "dropped_ratio": dropped_ratio}
    return {**files, "lines": lines, **report}


def describe_split(split, report, options):
    """One progress line about what happened to a split."""
    if split != "train":
        return (f"{split}: {report['lines']} pairs kept in order ({report['empty_pairs']} with an "
                f"empty side, {report['duplicate_pairs']} repeated, {report['ratio_outliers']} "
                f"with length ratio > {options['max_ratio']:g})")
    duplicates = "dropped" if options["dedup"] else "kept; --dedup drops them"
    outliers = "dropped" if options["filter_ratio"] else "kept; --filter_ratio drops them"
    return (f"train: {report['lines']} of {report['input_lines']} pairs kept; "
            f"{report['dropped_empty']} with an empty side dropped; {report['duplicate_pairs']} "
            f"repeated pairs ({duplicates}); {report['ratio_outliers']} with length ratio > "
            f"{options['max_ratio']:g} ({outliers})")
