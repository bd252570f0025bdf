"""translate.py: arguments, files and standard input through a pipe; over-long and empty lines; attention PNGs;
errors as one line, with the session's tiny trained model (conftest.py)."""
import math
import os
import queue
import random
import subprocess
import sys
import threading
import time

import pytest
import sentencepiece as spm

import prepro
import translate
from toolkit.translating import documents, sentences
from toolkit.base.errors import UserError
from in_process import run_in_process
from model_fixtures import TINY_MODEL_MAXLEN1

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAXLEN1 = TINY_MODEL_MAXLEN1  # the model's source limit: 19 pieces and </s>
SENTENCE = "Er zählt bis elf."
OTHER = "dreihundertzehn"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def model(tiny_model):
    """(logdir, data_dir) of the session's tiny model (conftest.py), trained with --maxlen1 MAXLEN1."""
    return tiny_model


def run_main(capsys, *argv):
    """translate.main in this process. Returns (stdout lines, stderr)."""
    assert translate.main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


def command(logdir, *args):
    return [sys.executable, "translate.py", "--logdir", logdir, *args]


def sentences_per_part(data_dir):
    """How many copies of SENTENCE fit in one part of at most MAXLEN1 - 1 pieces."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "bpe.model"))
    pieces = sp.encode(SENTENCE, out_type=str)
    assert pieces[-1] == "."
    return (MAXLEN1 - 1) // len(pieces)


def test_pipe_translates_each_line_as_it_comes(model, capsys):
    logdir, data_dir = model
    per_part = sentences_per_part(data_dir)
    long_line = " ".join([SENTENCE] * (2 * per_part + 1))  # cut after sentence ends into parts of per_part, 1
    process = subprocess.Popen(command(logdir, "--no_split"), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    outputs = []
    for text in [SENTENCE, "", long_line, OTHER]:
        process.stdin.write(text.encode("utf-8") + b"\n")
        process.stdin.flush()
        outputs.append(lines.get(timeout=120).decode("utf-8").rstrip("\n"))  # before the next line is sent
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    stderr = process.stderr.read().decode("utf-8")
    assert lines.empty()

    expected, _ = run_main(capsys, "--logdir", logdir, "--no_split", SENTENCE, OTHER,
                           " ".join([SENTENCE] * per_part))
    assert outputs[0] == expected[0] and outputs[1] == "" and outputs[3] == expected[1]
    assert outputs[2] == " ".join([expected[2], expected[2], expected[0]])
    assert "line 2 is empty; printed an empty line" in stderr
    assert ("line 3 has %d pieces, more than the %d (and </s>) the model was trained on (--maxlen1 %d): translated "
            "in 3 parts, cut after sentence punctuation" % (6 * (2 * per_part + 1), MAXLEN1 - 1, MAXLEN1)) in stderr


def test_arguments_keep_order_and_beam_nbest_is_sorted(model, capsys):
    logdir, _ = model
    outputs, stderr = run_main(capsys, "--logdir", logdir, OTHER, "   ", SENTENCE)
    alone, _ = run_main(capsys, "--logdir", logdir, SENTENCE)
    assert len(outputs) == 3 and outputs[1] == "" and outputs[2] == alone[0]
    assert "sentence 2 is empty" in stderr

    nbest, _ = run_main(capsys, "--logdir", logdir, "--beam_size", "4", "--nbest", "3", SENTENCE, "", OTHER)
    fields = [line.split(" ||| ") for line in nbest]
    assert [f[0] for f in fields] == sorted(f[0] for f in fields) and {f[0] for f in fields} == {"0", "1", "2"}
    assert fields[[f[0] for f in fields].index("1")][1:] == ["", "0.0000", "0.0000"]
    for number in ("0", "2"):
        scores = [float(f[2]) for f in fields if f[0] == number]
        assert 1 <= len(scores) <= 3 and scores == sorted(scores, reverse=True)


def test_a_three_sentence_paragraph_comes_back_as_three_translated_sentences_with_its_spacing(
        model, capsys, tmp_path):
    logdir, _ = model
    three = ["Heute ist der erste Mai.", "Die Zahl ist elf.", "Er zählt bis drei."]
    alone, _ = run_main(capsys, "--logdir", logdir, *three)
    assert len(set(alone)) == 3 and all(alone)
    paragraph, expected = " %s  %s\t%s " % tuple(three), " %s  %s\t%s " % tuple(alone)
    assert run_main(capsys, "--logdir", logdir, paragraph)[0] == [expected]
    source = tmp_path / "paragraphs.txt"
    source.write_text("%s\n%s\n" % (paragraph, three[1]), encoding="utf-8")
    assert run_main(capsys, "--logdir", logdir, "--input", str(source))[0] == [expected, alone[1]]
    piped = subprocess.run(command(logdir), cwd=ROOT, input=source.read_bytes(), capture_output=True, check=True)
    assert piped.stdout.decode("utf-8").split("\n") == [expected, alone[1], ""]
    # a line break inside an argument is a space: one line in, one out
    assert run_main(capsys, "--logdir", logdir, "%s\n%s" % tuple(three[:2]))[0] == [" ".join(alone[:2])]
    # the n-best entry of a paragraph: its sentences' best, with the sum of their scores
    best = [run_main(capsys, "--logdir", logdir, "--beam_size", "2", "--nbest", "2", sentence)[0][0]
            for sentence in three]
    first = run_main(capsys, "--logdir", logdir, "--beam_size", "2", "--nbest", "2", paragraph)[0][0]
    assert first.split(" ||| ")[1] == " %s  %s\t%s " % tuple(line.split(" ||| ")[1] for line in best)
    assert abs(float(first.split(" ||| ")[2]) - sum(float(line.split(" ||| ")[2]) for line in best)) < 3e-4
    # --no_split decodes the paragraph as one sequence, as before
    whole, _ = run_main(capsys, "--logdir", logdir, "--no_split", paragraph)
    assert len(whole) == 1 and whole != [expected] and "\t" not in whole[0]


def test_input_file_with_crlf_and_no_final_newline(model, capsys, tmp_path):
    logdir, _ = model
    source, target = tmp_path / "source.txt", tmp_path / "target.txt"
    source.write_bytes(("%s\r\n\r\n%s" % (SENTENCE, OTHER)).encode("utf-8"))
    printed, stderr = run_main(capsys, "--logdir", logdir, "--input", str(source), "--output", str(target))
    expected, _ = run_main(capsys, "--logdir", logdir, SENTENCE, OTHER)
    assert printed == [] and "line 2 is empty" in stderr
    assert target.read_text(encoding="utf-8").split("\n") == [expected[0], "", expected[1], ""]


def test_invalid_utf8_file_is_an_error_naming_the_line(model, tmp_path):
    logdir, _ = model
    source = tmp_path / "bad.txt"
    source.write_bytes(b"elf\nzw\xf6lf\n")
    with pytest.raises(UserError, match=r"bad.txt: line 2 is not valid UTF-8"):
        translate.main(["--logdir", logdir, "--input", str(source)])


def test_plot_attention_writes_one_png_per_sentence(model, capsys, tmp_path):
    logdir, _ = model
    plots = tmp_path / "plots"
    outputs, _ = run_main(capsys, "--logdir", logdir, "--plot_attention", str(plots), SENTENCE, "", OTHER)
    assert len(outputs) == 3
    assert sorted(os.listdir(plots)) == ["0001.png", "0003.png", "positional_encoding.png"]
    for name in os.listdir(plots):
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name


def test_parse_args_splits_sentences_from_flags(model):
    logdir, _ = model
    hp, args = translate.parse_args(["--logdir", logdir, "eins", "--beam_size", "4", "zwei", "--nbest", "2"])
    assert args.sentences == ["eins", "zwei"] and args.nbest == 2
    assert hp.beam_size == 4 and hp.d_model == 32 and hp.maxlen1 == MAXLEN1
    with pytest.raises(UserError, match="--nbest 2 needs --beam_size 2 or more"):
        translate.parse_args(["--logdir", logdir, "--nbest", "2", "eins"])


def test_split_pieces_prefers_sentence_ends_then_commas_then_words():
    assert sentences.split_pieces(["▁a", ".", "▁b", ",", "▁c", "d"], 4) == (
        [["▁a", "."], ["▁b", ",", "▁c", "d"]], ["after sentence punctuation"])
    assert sentences.split_pieces(["▁a", ",", "▁b", "▁c", "d"], 4) == (
        [["▁a", ","], ["▁b", "▁c", "d"]], ["after , ; or :"])
    assert sentences.split_pieces(["▁ab", "c", "▁d", "e", "f"], 3) == ([["▁ab", "c"], ["▁d", "e", "f"]],
                                                                       ["between words"])
    assert sentences.split_pieces(["▁a", "b", "c", "d", "e"], 2) == (
        [["▁a", "b"], ["c", "d"], ["e"]], ["inside a word", "inside a word"])
    assert sentences.split_pieces(["▁a", "b"], 2) == ([["▁a", "b"]], [])


def test_split_pieces_of_a_long_line_cuts_where_cutting_the_rest_again_and_again_would():
    """The split reads a window of the line at each cut: the same parts as cutting the whole rest each time."""
    def split_by_cutting_the_rest(pieces, limit):
        parts, cuts = [], []
        while len(pieces) > limit:
            k, description = sentences.best_cut(pieces, limit)
            parts, cuts, pieces = parts + [pieces[:k]], cuts + [description], pieces[k:]
        return parts + [pieces], cuts

    rng = random.Random(3)
    pieces = [rng.choice(["▁a", "b", "c,", "d.", "▁e", "f"]) for _ in range(5000)]
    for limit in (1, 2, 7, 100):
        assert sentences.split_pieces(pieces, limit) == split_by_cutting_the_rest(pieces, limit)


def test_a_line_over_spacy_s_character_limit_is_one_output_line(model, capsys):
    """spaCy refuses a text of more than nlp.max_length (1,000,000) characters: the split hands it pieces below that,
    and the line is translated as its one sentence with the spacing kept."""
    logdir, _ = model
    alone, _ = run_main(capsys, "--logdir", logdir, SENTENCE)
    out, err = run_main(capsys, "--logdir", logdir, " " * 1_000_001 + SENTENCE)
    assert out == [" " * 1_000_001 + alone[0]] and "Traceback" not in err


def test_a_text_over_spacy_s_limit_splits_into_its_sentences_and_joins_back():
    three = ["Heute ist der erste Mai.", "Die Zahl ist elf!", "Er zählt bis drei?"]
    text = "  ".join(three * 20000) + "\n"  # 1.3 million characters
    pieces = documents.split(text, "de")
    assert "".join(pieces) == text
    assert pieces[1::2] == three * 20000 and set(pieces[2:-1:2]) == {"  "} and pieces[-1] == "\n"


@pytest.mark.parametrize("text", [".," * 2500, "!?" * 2500, "(" * 5000, "„“" * 2500, ("x" * 70 + "., ") * 70])
def test_a_run_of_punctuation_splits_in_well_under_a_second_and_joins_back(text):
    """spaCy's tokenizer takes time quadratic in the length of a run without spaces (5,000 characters of ".," took
    seconds): the split shows it such a run's last characters only."""
    documents.split("Lädt den Sentencizer.", "de")
    start = time.monotonic()
    pieces = documents.split(text, "de")
    assert time.monotonic() - start < 1.0 and "".join(pieces) == text


def test_errors_are_one_line_without_traceback(model, tmp_path, capsys):
    logdir, _ = model
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    (untrained / "hparams.json").write_text(open(os.path.join(logdir, "hparams.json")).read())
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", untrained, SENTENCE)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and "Traceback" not in err
    assert errors == ["error: checkpoint (none) not found; checkpoints in %s: none, train first" % untrained]

    other_vocab = str(tmp_path / "other")
    assert prepro.main(["--dataset", "numbers", "--n_train", "2000", "--n_eval", "5", "--n_test", "5",
                        "--vocab_size", "250", "--data_dir", other_vocab]) == 0
    with pytest.raises(UserError, match="vocab size 250 of %s does not match vocab size 300" % other_vocab):
        translate.main(["--logdir", logdir, "--data_dir", other_vocab, SENTENCE])


def test_ctranslate2_engine_prints_our_greedy_translations(model, capsys, tmp_path):
    """The model converted by export.py --format ctranslate2 and run by translate.py --engine ctranslate2 (one
    sentence per batch, so that each gets its own length limit) against the TensorFlow engine, greedy, both in
    float32 (the model's --precision is pinned here too: bf16 decoding differs from float32 in a few tokens)."""
    pytest.importorskip("ctranslate2")
    import export
    logdir, data_dir = model
    export_dir = str(tmp_path / "ct2")
    assert export.main(["--logdir", logdir, "--export_dir", export_dir, "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    sources = tmp_path / "sources.txt"  # the first 25 test sentences
    sources.write_text("".join(open(os.path.join(data_dir, "test.1"), encoding="utf-8").readlines()[:25]),
                       encoding="utf-8")
    ours, _ = run_main(capsys, "--logdir", logdir, "--input", str(sources), "--beam_size", "1",
                       "--precision", "fp32")
    theirs, _ = run_main(capsys, "--engine", "ctranslate2", "--model", export_dir, "--input", str(sources),
                         "--beam_size", "1", "--test_batch_size", "1")
    assert len(ours) == len(theirs) == 25 and len(set(ours)) >= 10, ours
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(ours), [(a, b) for a, b in zip(ours, theirs) if a != b]


def test_ctranslate2_engine_without_a_model_dir_is_one_line(tmp_path, capsys):
    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--engine", "ctranslate2", "--model",
                                  tmp_path, "Ein Satz.")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: --model %s is not a directory written by export.py --format ctranslate2 (no readable "
        "translate.json)" % tmp_path]


# ---------------------------------------------------------------- confidence, prefixes, sampling
def nbest_fields(lines):
    """translate.py --nbest lines as (line, text, score, confidence)."""
    return [(int(line), text, float(score), float(confidence)) for line, text, score, confidence
            in (entry.split(" ||| ") for entry in lines)]


def test_nbest_confidence_is_exp_of_score_s_log_prob_over_its_tokens(model, capsys, tmp_path):
    logdir, data_dir = model
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "bpe.model"))
    lines, _ = run_main(capsys, "--logdir", logdir, "--beam_size", "4", "--nbest", "3", SENTENCE, OTHER)
    entries = nbest_fields(lines)
    assert len(entries) >= 4 and all(0 < confidence <= 1 for *_, confidence in entries)
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("".join([SENTENCE, OTHER][line] + "\n" for line, *_ in entries), encoding="utf-8")
    references.write_text("".join(text + "\n" for _, text, _, _ in entries), encoding="utf-8")
    scored, _ = run_main(capsys, "--logdir", logdir, "--input", str(sources), "--score", str(references))
    for (_, text, _, confidence), line in zip(entries, scored):
        tokens = len(sp.encode(text, out_type=str)) + 1  # with </s>
        assert confidence == pytest.approx(math.exp(float(line.split("\t")[0]) / tokens), abs=2e-4)


def test_min_confidence_prints_an_empty_line_with_a_note_and_drops_nbest_entries(model, capsys):
    logdir, _ = model
    lines, err = run_main(capsys, "--logdir", logdir, "--min_confidence", "1", SENTENCE, "", OTHER)
    assert lines == ["", "", ""]
    assert "sentence 1 has confidence 0." in err and "below --min_confidence 1: printed an empty line" in err
    assert "sentence 3 has confidence" in err and "sentence 2 has confidence" not in err
    entries = nbest_fields(run_main(capsys, "--logdir", logdir, "--beam_size", "4", "--nbest", "4", SENTENCE)[0])
    middle = sorted(confidence for *_, confidence in entries)[len(entries) // 2]
    kept = nbest_fields(run_main(capsys, "--logdir", logdir, "--beam_size", "4", "--nbest", "4",
                                 "--min_confidence", str(middle - 5e-5), SENTENCE)[0])
    assert kept == [entry for entry in entries if entry[3] >= middle]


def test_prefix_file_starts_the_first_sentence_s_translation(model, capsys, tmp_path):
    logdir, _ = model
    other, _ = run_main(capsys, "--logdir", logdir, OTHER)
    prefix = " ".join(other[0].split()[:2])
    sources, prefixes = tmp_path / "src.txt", tmp_path / "prefixes.txt"
    sources.write_text("%s\n%s\n%s %s\n" % (SENTENCE, SENTENCE, SENTENCE, SENTENCE), encoding="utf-8")
    prefixes.write_text("%s\n\n%s\n" % (prefix, prefix), encoding="utf-8")
    free, _ = run_main(capsys, "--logdir", logdir, "--input", str(sources))
    forced, _ = run_main(capsys, "--logdir", logdir, "--input", str(sources), "--prefix_file", str(prefixes))
    assert forced[0].startswith(prefix) and forced[0] != free[0]
    assert forced[1] == free[1]  # an empty prefix line: no prefix
    # a line of two sentences: the first starts with the prefix, the second is translated freely
    assert forced[2].startswith(prefix) and forced[2].endswith(free[0])
    prefixes.write_text("%s\n" % prefix, encoding="utf-8")
    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--input",
                                  sources, "--prefix_file", prefixes)
    assert code == 2 and err.count("\n") == 1
    assert "--prefix_file %s has 1 lines but --input %s has 3" % (prefixes, sources) in err


def test_nbest_past_the_beam_draws_samples_when_sampling(model, capsys):
    logdir, _ = model
    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--nbest", "3",
                                  SENTENCE)
    assert code == 2 and "--nbest 3 needs --beam_size 3 or more (now 1), or sampling" in err
    lines, _ = run_main(capsys, "--logdir", logdir, "--nbest", "3", "--sampling_topk", "0", "--seed", "3",
                        SENTENCE)
    entries = nbest_fields(lines)
    assert len(entries) == 3 and [score for _, _, score, _ in entries] == sorted(
        (score for _, _, score, _ in entries), reverse=True)
    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--beam_size", "2",
                                  "--sampling_topk", "0", SENTENCE)
    assert code == 2 and "needs --beam_size 1, not 2" in err
