"""Tests for prepro.py: the numbers corpus, cleaning, BPE, validation, downloads and the data directory."""

import functools
import gzip
import http.server
import io
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import sentencepiece as spm

from toolkit.data import build
from toolkit.data import datadir
import prepro
from data_load import load_side
from toolkit.base.reading import sha256_file
from toolkit.data.corpora import SPLITS, LinesOf
from toolkit.data.corpora.download import MULTI30K_FILES
from toolkit.data.corpora.numbers import (date_pair, english_cardinal, english_year,
                                          german_cardinal, numbers_corpus)
from toolkit.base.writing import atomic_write
from toolkit.base.reading import clean_line, decode_lines

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K_DIR = REPO_ROOT.parent / "shared/data/multi30k"
SMALL_NUMBERS = ["--n_train", "3000", "--n_eval", "100", "--n_test", "100", "--vocab_size", "300"]
GERMAN_WORDS = ["Haus", "Baum", "Hund", "Katze", "Straße", "grün", "läuft", "schnell", "über", "Wiese"]
ENGLISH_WORDS = ["house", "tree", "dog", "cat", "street", "green", "runs", "fast", "over", "meadow"]


# ------------------------------------------------------------------------------------------------
# Helpers


def run_prepro(*argv):
    """Run prepro.main with string arguments; returns its exit code."""
    return prepro.main([str(arg) for arg in argv])


def read_manifest(data_dir):
    """The manifest of a data directory."""
    return datadir.read_manifest(data_dir)


def raw_lines(path):
    """Lines of a file written by prepro ('\\n' endings)."""
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def toy_sentences(count, words, offset):
    """``count`` distinct short sentences built from ``words``."""
    return [" ".join(words[(i * 7 + offset + k) % len(words)] for k in range(1 + i % 5)) + f" {i}."
            for i in range(count)]


def write_corpus(folder, lines_by_name, newline="\n", final_newline=True):
    """Write {file name: lines} into ``folder``; returns {file name: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, lines in lines_by_name.items():
        text = newline.join(lines) + (newline if final_newline and lines else "")
        paths[name] = folder / name
        paths[name].write_bytes(text.encode("utf-8"))
    return paths


def files_args(paths):
    """--dataset files arguments for {'train1': path, ...}."""
    args = ["--dataset", "files"]
    for flag in ("train1", "train2", "eval1", "eval2", "test1", "test2"):
        args += [f"--{flag}", paths[flag]]
    return args


def toy_corpus(folder, eval_newline="\n"):
    """A small parallel corpus with the awkward cases; returns {flag: path}."""
    train1 = toy_sentences(300, GERMAN_WORDS, 0)
    train2 = toy_sentences(300, ENGLISH_WORDS, 3)
    train1 += ["", "   ", "Haus", train1[0], train1[1], "Hund " * 40]
    train2 += ["dog", "\t", "", train2[0], train2[1], "dog"]
    eval1 = ["Hund läuft schnell.", "", "Katze  über   Wiese", "Haus", "Hund " * 40, "Hund läuft schnell."]
    eval2 = ["dog runs fast.", "", "cat over meadow", "", "dog", "dog runs fast."]
    lines = {"train.de": train1, "train.en": train2, "dev.de": eval1, "dev.en": eval2,
             "test.de": eval1[::-1], "test.en": eval2[::-1]}
    write_corpus(folder, lines)
    write_corpus(folder, {"dev.de": eval1, "dev.en": eval2}, newline=eval_newline, final_newline=False)
    return {"train1": folder / "train.de", "train2": folder / "train.en", "eval1": folder / "dev.de",
            "eval2": folder / "dev.en", "test1": folder / "test.de", "test2": folder / "test.en"}


@pytest.fixture(scope="module")
def numbers_dir(tmp_path_factory):
    """A small numbers data directory, built once for several tests."""
    data_dir = tmp_path_factory.mktemp("numbers")
    assert run_prepro("--data_dir", data_dir, *SMALL_NUMBERS) == 0
    return data_dir


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving a temporary folder: yields (folder, base URL, request log)."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    root = tmp_path / "www"
    root.mkdir()
    requests = []

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()
    thread.join()


# ------------------------------------------------------------------------------------------------
# The numbers corpus


@pytest.mark.parametrize("number, german, english", [
    (0, "null", "zero"),
    (1, "eins", "one"),
    (21, "einundzwanzig", "twenty-one"),
    (101, "einhunderteins", "one hundred and one"),
    (1001, "eintausendeins", "one thousand and one"),
    (21000, "einundzwanzigtausend", "twenty-one thousand"),
    (101000, "einhunderteintausend", "one hundred and one thousand"),
    (999999, "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
     "nine hundred and ninety-nine thousand nine hundred and ninety-nine"),
])
def test_number_words(number, german, english):
    assert german_cardinal(number) == german
    assert english_cardinal(number) == english


def test_date_words():
    assert date_pair(1984, 3, 21, 0) == ("der einundzwanzigste März neunzehnhundertvierundachtzig",
                                                "the twenty-first of March nineteen eighty-four")
    assert date_pair(2014, 7, 3, 2) == ("Sie wurde am dritten Juli zweitausendvierzehn geboren.",
                                               "She was born on the third of July two thousand and fourteen.")
    assert english_year(1905) == "nineteen oh five"


def test_numbers_corpus_is_deterministic_and_disjoint():
    corpus = numbers_corpus(2000, 200, 200, seed=5)
    assert corpus == numbers_corpus(2000, 200, 200, seed=5)
    assert corpus != numbers_corpus(2000, 200, 200, seed=6)
    sources = {split: set(corpus[split][0]) for split in SPLITS}
    assert [len(sources[split]) for split in SPLITS] == [2000, 200, 200]
    assert not sources["train"] & sources["eval"]
    assert not sources["train"] & sources["test"]
    assert not sources["eval"] & sources["test"]


def test_numbers_data_dir_is_byte_identical_for_a_seed(numbers_dir, tmp_path):
    again, other_seed = tmp_path / "again", tmp_path / "other"
    assert run_prepro("--data_dir", again, *SMALL_NUMBERS) == 0
    assert run_prepro("--data_dir", other_seed, "--seed", "2", *SMALL_NUMBERS) == 0
    names = sorted(path.name for path in numbers_dir.iterdir())
    assert names == sorted(path.name for path in again.iterdir())
    assert len(names) == 27  # manifest, bpe.model, bpe.vocab; per split and side: text, .bpe, .ids, .offsets
    for name in names:
        assert (numbers_dir / name).read_bytes() == (again / name).read_bytes(), name
    assert (numbers_dir / "train.1").read_bytes() != (other_seed / "train.1").read_bytes()


def test_numbers_splits_on_disk_are_disjoint(numbers_dir):
    train = set(raw_lines(numbers_dir / "train.1"))
    held_out = raw_lines(numbers_dir / "eval.1") + raw_lines(numbers_dir / "test.1")
    assert len(held_out) == 200
    assert not train & set(held_out)


def test_manifest_layout(numbers_dir):
    manifest = read_manifest(numbers_dir)
    assert manifest["format"] == 2 and manifest["dataset"] == "numbers" and manifest["ids_dtype"] == "uint16"
    assert manifest["bpe_training"] == {"sentences": 6000, "sample": None}
    assert (manifest["src_lang"], manifest["tgt_lang"]) == ("de", "en")
    assert manifest["vocab_size"] == 300
    assert (manifest["bpe_model"], manifest["bpe_vocab"]) == ("bpe.model", "bpe.vocab")
    assert manifest["options"]["seed"] == 1 and manifest["options"]["n_train"] == 3000
    for split, count in (("train", 3000), ("eval", 100), ("test", 100)):
        info = manifest["splits"][split]
        assert info["lines"] == count and info["dropped_empty"] == 0
        for key in ("raw1", "raw2", "bpe1", "bpe2"):
            assert len(raw_lines(numbers_dir / info[key])) == count
        for side in (1, 2):
            assert (numbers_dir / info[f"offsets{side}"]).stat().st_size == 8 * (count + 1)


def test_reverse_makes_side_1_the_english(numbers_dir, tmp_path):
    """--reverse on the numbers corpus: the same pairs, English on side 1 and German on side 2, languages swapped."""
    reverse_dir = tmp_path / "reverse"
    assert run_prepro("--data_dir", reverse_dir, *SMALL_NUMBERS, "--reverse") == 0
    forward, reverse = read_manifest(numbers_dir), read_manifest(reverse_dir)
    assert (reverse["src_lang"], reverse["tgt_lang"]) == ("en", "de") and reverse["options"]["reverse"] is True
    assert "reverse" not in forward["options"]
    for split in SPLITS:
        files, reversed_files = forward["splits"][split], reverse["splits"][split]
        assert raw_lines(reverse_dir / reversed_files["raw1"]) == raw_lines(numbers_dir / files["raw2"])
        assert raw_lines(reverse_dir / reversed_files["raw2"]) == raw_lines(numbers_dir / files["raw1"])
    english = raw_lines(reverse_dir / reverse["splits"]["test"]["raw1"])
    assert sum(" and " in line or "thousand" in line for line in english) > 10, english[:5]


def test_reverse_swaps_the_files_and_their_languages(tmp_path):
    """--dataset files --reverse: side 1 is read from --train2 ..., and --src_lang names the files of side 1."""
    paths = toy_corpus(tmp_path / "in")
    data_dir = tmp_path / "data"
    assert run_prepro(*files_args(paths), "--vocab_size", "80", "--data_dir", data_dir, "--src_lang", "de",
                      "--tgt_lang", "en", "--reverse") == 0
    manifest = read_manifest(data_dir)
    assert (manifest["src_lang"], manifest["tgt_lang"]) == ("en", "de")
    assert manifest["inputs"]["train1"]["source"] == str(paths["train2"])
    assert raw_lines(data_dir / manifest["splits"]["eval"]["raw1"])[0] == "dog runs fast."


# ------------------------------------------------------------------------------------------------
# BPE model


def test_special_ids_are_fixed(numbers_dir):
    processor = spm.SentencePieceProcessor(model_file=str(numbers_dir / "bpe.model"))
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2, 3)
    assert [processor.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = raw_lines(numbers_dir / "bpe.vocab")
    assert len(vocab) == processor.get_piece_size() == 300
    assert [line.split("\t")[0] for line in vocab] == [processor.id_to_piece(i) for i in range(300)]


def assert_round_trip(data_dir, splits=SPLITS):
    """decode(encode(s)) == s for every line, and the .bpe and .ids files hold encode(s)."""
    processor = spm.SentencePieceProcessor(model_file=str(data_dir / "bpe.model"))
    manifest = read_manifest(data_dir)
    checked = 0
    for split in splits:
        for side in (1, 2):
            lines = raw_lines(data_dir / f"{split}.{side}")
            pieces = raw_lines(data_dir / f"{split}.{side}.bpe")
            ids, offsets = load_side(str(data_dir), manifest, split, side)
            assert len(lines) == len(pieces) == len(offsets) - 1
            for i, (line, bpe_line) in enumerate(zip(lines, pieces)):
                assert processor.decode(processor.encode(line)) == line
                assert bpe_line == " ".join(processor.encode(line, out_type=str))
                assert ids[offsets[i]:offsets[i + 1]].tolist() == processor.encode(line)
                checked += 1
    assert checked > 0


def test_bpe_round_trip_numbers(numbers_dir):
    assert_round_trip(numbers_dir)


def test_bpe_round_trip_files_corpus(tmp_path):
    data_dir = tmp_path / "data"
    assert run_prepro(*files_args(toy_corpus(tmp_path / "in")), "--vocab_size", "80", "--data_dir", data_dir) == 0
    assert_round_trip(data_dir)


# ------------------------------------------------------------------------------------------------
# Cleaning and filtering


def test_dev_and_test_keep_every_line_in_order(tmp_path):
    paths = toy_corpus(tmp_path / "in", eval_newline="\r\n")
    data_dir = tmp_path / "data"
    assert run_prepro(*files_args(paths), "--vocab_size", "80", "--dedup", "--filter_ratio",
                      "--data_dir", data_dir) == 0
    expected_dev = ["Hund läuft schnell.", "", "Katze über Wiese", "Haus", ("Hund " * 40).strip(),
                    "Hund läuft schnell."]
    assert raw_lines(data_dir / "eval.1") == expected_dev
    assert raw_lines(data_dir / "eval.2") == ["dog runs fast.", "", "cat over meadow", "", "dog", "dog runs fast."]
    assert raw_lines(data_dir / "test.1") == expected_dev[::-1]
    bpe = raw_lines(data_dir / "eval.1.bpe")
    assert len(bpe) == 6 and bpe[1] == "" and bpe[0] == bpe[5] != ""
    manifest = read_manifest(data_dir)
    for split in ("eval", "test"):
        info = manifest["splits"][split]
        assert info["lines"] == info["input_lines"] == 6
        assert (info["empty_pairs"], info["duplicate_pairs"], info["ratio_outliers"]) == (2, 1, 1)
        assert info["dropped_empty"] == info["dropped_duplicates"] == info["dropped_ratio"] == 0


def test_train_drops_empty_pairs_and_reports_the_rest(tmp_path, capsys):
    paths = toy_corpus(tmp_path / "in")
    assert run_prepro(*files_args(paths), "--vocab_size", "80", "--data_dir", tmp_path / "report") == 0
    report = read_manifest(tmp_path / "report")["splits"]["train"]
    assert (report["input_lines"], report["lines"]) == (306, 303)
    assert (report["empty_pairs"], report["dropped_empty"]) == (3, 3)
    assert (report["duplicate_pairs"], report["dropped_duplicates"]) == (2, 0)
    assert (report["ratio_outliers"], report["dropped_ratio"]) == (1, 0)
    assert "3 with an empty side dropped" in capsys.readouterr().out
    assert "" not in raw_lines(tmp_path / "report" / "train.1")

    assert run_prepro(*files_args(paths), "--vocab_size", "80", "--dedup", "--filter_ratio",
                      "--data_dir", tmp_path / "filtered") == 0
    report = read_manifest(tmp_path / "filtered")["splits"]["train"]
    assert (report["lines"], report["dropped_duplicates"], report["dropped_ratio"]) == (300, 2, 1)
    train = list(zip(raw_lines(tmp_path / "filtered" / "train.1"), raw_lines(tmp_path / "filtered" / "train.2")))
    assert len(train) == len(set(train)) == 300


def test_windows_line_endings_and_missing_final_newline():
    assert decode_lines(b"a\r\nb\r\n\r\nc", "x") == ["a", "b", "", "c"]
    assert decode_lines(b"\xef\xbb\xbfa\n\n", "x") == ["a", ""]
    assert decode_lines(b"", "x") == []
    assert clean_line("  a\u00a0 b\tc \r") == "a b c"


# ------------------------------------------------------------------------------------------------
# Bad input: one clear line, non-zero exit


def test_different_line_counts(tmp_path, capsys):
    paths = toy_corpus(tmp_path / "in")
    paths["eval2"].write_text("only one line\n", encoding="utf-8")
    assert run_prepro(*files_args(paths), "--data_dir", tmp_path / "data") == 2
    error = capsys.readouterr().err
    assert f"{paths['eval1']} has 6 lines but {paths['eval2']} has 1" in error


def test_invalid_utf8_names_file_and_line(tmp_path, capsys):
    paths = toy_corpus(tmp_path / "in")
    paths["test2"].write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    assert run_prepro(*files_args(paths), "--data_dir", tmp_path / "data") == 2
    error = capsys.readouterr().err
    assert f"{paths['test2']}: line 3 is not valid UTF-8" in error


def test_missing_file(tmp_path, capsys):
    paths = toy_corpus(tmp_path / "in")
    paths["train2"] = tmp_path / "nowhere.en"
    assert run_prepro(*files_args(paths), "--data_dir", tmp_path / "data") == 2
    assert f"file not found: {tmp_path / 'nowhere.en'} (--train2)" in capsys.readouterr().err


def test_vocab_size_too_large(tmp_path, capsys):
    paths = toy_corpus(tmp_path / "in")
    assert run_prepro(*files_args(paths), "--vocab_size", "50000", "--data_dir", tmp_path / "data") == 2
    error = capsys.readouterr().err
    assert "--vocab_size 50000 is too large for this training corpus: use --vocab_size" in error
    assert not (tmp_path / "data" / datadir.MANIFEST_NAME).exists()


def test_existing_data_dir_with_other_options(numbers_dir, capsys):
    before = {path.name: path.stat().st_mtime_ns for path in numbers_dir.iterdir()}
    assert run_prepro("--data_dir", numbers_dir, *SMALL_NUMBERS) == 0
    assert "up to date" in capsys.readouterr().out
    assert before == {path.name: path.stat().st_mtime_ns for path in numbers_dir.iterdir()}

    assert run_prepro("--data_dir", numbers_dir, *SMALL_NUMBERS[:-1], "400") == 2
    error = capsys.readouterr().err
    assert "built from other inputs or options (vocab_size 300 -> 400)" in error and "--force" in error
    assert read_manifest(numbers_dir)["vocab_size"] == 300


def test_bpe_model_reuses_another_data_dirs_vocabulary(numbers_dir, tmp_path, capsys):
    """A corpus of another seed segmented with numbers_dir's bpe.model: the same fingerprint (what train.py
    --init_from compares), no BPE trained, and the ids its model gives; a file that is no model is one line."""
    other = tmp_path / "other"
    assert run_prepro("--data_dir", other, "--seed", "5", "--n_train", "400", "--n_eval", "20", "--n_test", "20",
                      "--bpe_model", numbers_dir / "bpe.model") == 0
    original, reused = (datadir.load_manifest(str(path)) for path in (numbers_dir, other))
    assert datadir.fingerprint(str(other), reused) == datadir.fingerprint(str(numbers_dir), original)
    assert reused["vocab_size"] == 300 and reused["bpe_training"]["reused"] == str(numbers_dir / "bpe.model")
    assert "no BPE training" in capsys.readouterr().out
    sp = spm.SentencePieceProcessor(model_file=str(numbers_dir / "bpe.model"))
    assert raw_lines(other / "train.1.bpe")[:5] == [" ".join(sp.encode(line, out_type=str))
                                                    for line in raw_lines(other / "train.1")[:5]]
    for bad, message in ((tmp_path / "none.model", "cannot read --bpe_model %s: No such file or directory;"),
                         (numbers_dir / "bpe.vocab", "--bpe_model %s is not a sentencepiece model:")):
        assert run_prepro("--data_dir", tmp_path / "bad", "--bpe_model", bad) == 2
        assert capsys.readouterr().err.splitlines() == ["error: %s pass the bpe.model of a data dir" % (message % bad)]


def test_force_rebuilds(tmp_path):
    data_dir = tmp_path / "data"
    assert run_prepro("--data_dir", data_dir, *SMALL_NUMBERS) == 0
    assert run_prepro("--data_dir", data_dir, "--seed", "9", *SMALL_NUMBERS) == 2
    assert run_prepro("--data_dir", data_dir, "--seed", "9", "--force", *SMALL_NUMBERS) == 0
    assert read_manifest(data_dir)["options"]["seed"] == 9


def test_errors_are_one_line_without_traceback(tmp_path):
    paths = toy_corpus(tmp_path / "in")
    paths["train2"].write_text("one\ntwo\n", encoding="utf-8")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "prepro.py"), *map(str, files_args(paths)),
                             "--data_dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "has 2" in result.stderr


# ------------------------------------------------------------------------------------------------
# Downloads from a local HTTP server


def gzip_lines(path, lines):
    """Write ``lines`` gzipped, like the Multi30k raw files."""
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8")))


def test_multi30k_download(http_root, tmp_path, capsys):
    root, base_url, requests = http_root
    (root / "m30k").mkdir()
    sizes = {"train": 300, "val": 5, "test_2016_flickr": 4}
    for name, count in sizes.items():
        gzip_lines(root / "m30k" / f"{name}.de.gz", toy_sentences(count, GERMAN_WORDS, 1))
        gzip_lines(root / "m30k" / f"{name}.en.gz", toy_sentences(count, ENGLISH_WORDS, 2))
    data_dir = tmp_path / "data"
    args = ["--dataset", "multi30k", "--url", f"{base_url}/m30k", "--vocab_size", "80", "--data_dir", data_dir]

    assert run_prepro(*args) == 2
    error = capsys.readouterr().err
    assert f"{base_url}/m30k/train.de.gz unpacks to sha256" in error and "pass --no_verify" in error

    assert run_prepro(*args, "--no_verify") == 0
    manifest = read_manifest(data_dir)
    assert [manifest["splits"][split]["lines"] for split in SPLITS] == [300, 5, 4]
    assert raw_lines(data_dir / "eval.1") == toy_sentences(5, GERMAN_WORDS, 1)
    assert len(manifest["downloads"]) == 6
    assert manifest["downloads"][0]["sha256"] == sha256_file(data_dir / "download" / "train.de.gz")

    served = len(requests)
    assert run_prepro(*args, "--no_verify") == 0
    assert len(requests) == served
    assert "up to date" in capsys.readouterr().out


def iwslt_xml(lines, year):
    """An IWSLT-style dev/test XML file holding ``lines`` as <seg> elements."""
    segments = "\n".join(f'<seg id="{i}"> {line} </seg>' for i, line in enumerate(lines, 1))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="IWSLT16.TED.tst{year}">\n'
            f'<doc docid="1" genre="lectures">\n<url>http://example.org/talk</url>\n<talkid>1</talkid>\n'
            f'<title>A talk &amp; more</title>\n{segments}\n</doc>\n</srcset>\n</mteval>\n')


def add_tar_member(tar, name, text):
    """Add a regular file ``name`` with ``text`` to an open tar archive."""
    data = text.encode("utf-8")
    member = tarfile.TarInfo(name)
    member.size = len(data)
    tar.addfile(member, io.BytesIO(data))


def write_iwslt_archive(path, extra=None):
    """A small de-en.tgz with the IWSLT 2016 layout; ``extra(tar)`` may add more members."""
    markup = ["<url>http://example.org/talk</url>", "<keywords>talks</keywords>", "  <talkid>1</talkid>"]
    with tarfile.open(path, "w:gz") as tar:
        add_tar_member(tar, "de-en/train.tags.de-en.de", "\n".join(markup + toy_sentences(300, GERMAN_WORDS, 4)))
        add_tar_member(tar, "de-en/train.tags.de-en.en", "\n".join(markup + toy_sentences(300, ENGLISH_WORDS, 5)))
        for year, count in (("2013", 3), ("2014", 2)):
            add_tar_member(tar, f"de-en/IWSLT16.TED.tst{year}.de-en.de.xml",
                           iwslt_xml(toy_sentences(count, GERMAN_WORDS, 6), year))
            add_tar_member(tar, f"de-en/IWSLT16.TED.tst{year}.de-en.en.xml",
                           iwslt_xml([f"A & B {i}" for i in range(count)], year))
        if extra:
            extra(tar)


def test_iwslt2016_download(http_root, tmp_path):
    root, base_url, _ = http_root
    write_iwslt_archive(root / "de-en.tgz")
    data_dir = tmp_path / "data"
    assert run_prepro("--dataset", "iwslt2016", "--url", f"{base_url}/de-en.tgz", "--vocab_size", "80",
                      "--data_dir", data_dir) == 0
    manifest = read_manifest(data_dir)
    assert [manifest["splits"][split]["lines"] for split in SPLITS] == [300, 3, 2]
    assert raw_lines(data_dir / "train.1")[0] == toy_sentences(1, GERMAN_WORDS, 4)[0]
    assert raw_lines(data_dir / "eval.1") == toy_sentences(3, GERMAN_WORDS, 6)
    assert raw_lines(data_dir / "test.2") == ["A & B 0", "A & B 1"]
    assert manifest["downloads"][0]["sha256"] == sha256_file(root / "de-en.tgz")


def add_parent_escape(tar):
    add_tar_member(tar, "../evil", "escaped")


def add_absolute_path(tar):
    add_tar_member(tar, "/tmp/evil-absolute", "escaped")


def add_symlink(tar):
    member = tarfile.TarInfo("de-en/link")
    member.type = tarfile.SYMTYPE
    member.linkname = "/etc/passwd"
    tar.addfile(member)


@pytest.mark.parametrize("extra, reason", [(add_parent_escape, "'..' in path"),
                                           (add_absolute_path, "absolute path"),
                                           (add_symlink, "link")])
def test_unsafe_archives_are_rejected(http_root, tmp_path, capsys, extra, reason):
    root, base_url, _ = http_root
    write_iwslt_archive(root / "de-en.tgz", extra)
    data_dir = tmp_path / "deep" / "data"
    assert run_prepro("--dataset", "iwslt2016", "--url", f"{base_url}/de-en.tgz", "--vocab_size", "80",
                      "--data_dir", data_dir) == 2
    error = capsys.readouterr().err
    assert "refusing to extract" in error and f"({reason})" in error
    assert not (data_dir / "download" / "evil").exists() and not (tmp_path / "deep" / "evil").exists()
    assert not (data_dir / "download" / "de-en.extracted").exists()
    assert not (data_dir / "download" / "de-en.tgz").exists()


def test_missing_remote_file_gives_one_clear_line(http_root, tmp_path, capsys):
    _, base_url, _ = http_root
    assert run_prepro("--dataset", "iwslt2016", "--url", f"{base_url}/nothing.tgz", "--data_dir", tmp_path) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert f"cannot download {base_url}/nothing.tgz (HTTP Error 404" in error and "--dataset files" in error


def test_corrupt_gzip_is_rejected_and_removed(http_root, tmp_path, capsys):
    root, base_url, _ = http_root
    for name in MULTI30K_FILES.values():
        (root / name).write_bytes(b"\x1f\x8b" + b"not really gzip")
    data_dir = tmp_path / "data"
    assert run_prepro("--dataset", "multi30k", "--url", base_url, "--data_dir", data_dir) == 2
    assert f"{base_url}/train.de.gz is not a valid gzip file" in capsys.readouterr().err
    assert not (data_dir / "download" / "train.de.gz").exists()


def test_unreachable_url_gives_one_clear_line(tmp_path, capsys):
    assert run_prepro("--dataset", "multi30k", "--url", "http://127.0.0.1:1", "--data_dir", tmp_path / "data") == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "cannot download http://127.0.0.1:1/train.de.gz" in error and "--dataset files" in error


# ------------------------------------------------------------------------------------------------
# Atomic writes


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / datadir.MANIFEST_NAME
    atomic_write(target, b"old")
    with pytest.raises(TypeError):
        atomic_write(target, 42)
    assert target.read_bytes() == b"old"
    assert [path.name for path in tmp_path.iterdir()] == [datadir.MANIFEST_NAME]


# ------------------------------------------------------------------------------------------------
# The real Multi30k files


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K_DIR.is_dir(), reason=f"{MULTI30K_DIR} is absent")
def test_multi30k_files(tmp_path):
    paths = {"train1": "train.de", "train2": "train.en", "eval1": "dev.de", "eval2": "dev.en",
             "test1": "test.de", "test2": "test.en"}
    data_dir = tmp_path / "multi30k"
    args = files_args({flag: MULTI30K_DIR / name for flag, name in paths.items()})
    assert run_prepro(*args, "--vocab_size", "8000", "--data_dir", data_dir) == 0
    manifest = read_manifest(data_dir)
    assert manifest["vocab_size"] == 8000
    assert [manifest["splits"][split]["lines"] for split in SPLITS] == [29000, 1014, 1000]
    for split, name in (("eval", "dev"), ("test", "test")):
        for side, language in ((1, "de"), (2, "en")):
            original = (MULTI30K_DIR / f"{name}.{language}").read_text(encoding="utf-8").splitlines()
            assert raw_lines(data_dir / f"{split}.{side}") == [clean_line(line) for line in original]
    assert_round_trip(data_dir, splits=("train",))


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K_DIR.is_dir(), reason=f"{MULTI30K_DIR} is absent")
def test_multi30k_download_matches_known_sha256(http_root, tmp_path):
    root, base_url, _ = http_root
    local_names = {"train": "train", "val": "dev", "test_2016_flickr": "test"}
    for upstream, local in local_names.items():
        for language in ("de", "en"):
            (root / f"{upstream}.{language}.gz").write_bytes(
                gzip.compress((MULTI30K_DIR / f"{local}.{language}").read_bytes(), compresslevel=1))
    data_dir = tmp_path / "data"
    assert run_prepro("--dataset", "multi30k", "--url", base_url, "--vocab_size", "8000", "--data_dir", data_dir) == 0
    manifest = read_manifest(data_dir)
    assert [manifest["splits"][split]["lines"] for split in SPLITS] == [29000, 1014, 1000]
    assert manifest["inputs"]["eval2"]["source"] == f"{base_url}/val.en.gz"


# ------------------------------------------------------------------------------------------------
# Streaming: chunks of lines and a BPE sample


def toy_splits(folder):
    """The toy corpus as the splits build_data_dir streams, and its sources."""
    paths = toy_corpus(folder)
    sources = {flag: str(path) for flag, path in paths.items()}
    return {split: (LinesOf(paths[f"{split}1"]), LinesOf(paths[f"{split}2"])) for split in SPLITS}, sources


TOY_OPTIONS = {"dataset": "files", "vocab_size": 80, "dedup": True, "filter_ratio": True, "max_ratio": 9.0,
               "src_lang": "de", "tgt_lang": "en"}


def test_a_corpus_larger_than_a_chunk_gives_the_same_data_dir(tmp_path):
    splits, sources = toy_splits(tmp_path / "in")
    whole = build.build_data_dir(tmp_path / "whole", splits, TOY_OPTIONS, sources)
    chunked = build.build_data_dir(tmp_path / "chunked", splits, TOY_OPTIONS, sources, chunk_lines=7)
    assert whole == chunked and whole["splits"]["train"]["lines"] == 300  # 300 > 7: 43 chunks
    names = sorted(path.name for path in (tmp_path / "whole").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "chunked").iterdir())
    for name in names:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "chunked" / name).read_bytes(), name


def test_bpe_is_trained_on_a_seeded_sample_of_a_large_corpus(tmp_path):
    splits, sources = toy_splits(tmp_path / "in")
    builds = [build.build_data_dir(tmp_path / name, splits, TOY_OPTIONS, sources, sample_sentences=400)
              for name in ("a", "b")]
    # 301 pairs without an empty side or a repeat (the length-ratio outlier leaves train after BPE)
    assert builds[0]["bpe_training"] == {"sentences": 602, "sample": 400}
    spec = spm_model_spec(tmp_path / "a" / "bpe.model")
    assert (spec.input_sentence_size, spec.shuffle_input_sentence) == (400, True)
    assert (tmp_path / "a" / "bpe.model").read_bytes() == (tmp_path / "b" / "bpe.model").read_bytes()
    assert_round_trip(tmp_path / "a")


def spm_model_spec(path):
    """The trainer spec recorded in a sentencepiece model file."""
    from sentencepiece import sentencepiece_model_pb2
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(Path(path).read_bytes())
    return model.trainer_spec
