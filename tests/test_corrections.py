"""train.py --init_from RUN --suggestions DB --logdir NEW: a fine-tune on what users corrected, kept only when it
translates the held-out suggestions better than RUN without losing more than --max_dev_drop dev BLEU
(toolkit/training/corrections.py, docs/corrections.md). RUN is conftest.py's tiny_model, on the numbers corpus."""
import json
import os
import random

import pytest

import train
import translate
from in_process import run_in_process
from toolkit.data.corpora.numbers import ENGLISH_MONTHS, GERMAN_MONTHS, date_pair, number_pair
from toolkit.serving.suggestions import Store
from toolkit.training.corrections import REJECTED_EXIT_CODE, pairs_needed, split_pairs

#: A fine-tune short enough for a test: a few hundred pairs, many small batches, no dev decode before the end.
FINE_TUNE = ["--max_steps", "100", "--lr", "0.005", "--warmup_steps", "10", "--batch_size", "600",
             "--eval_every", "0", "--precision", "fp32"]
#: The word of the house style: the English name of one month, written so in every suggestion.
HOUSE_WORD = "Harvest"


def suggestions_db(path, pairs, source="de", target="en"):
    """A database of serve.py's with a suggestion for each (q, s) of pairs; returns its path."""
    store = Store(str(path))
    for q, s in pairs:
        store.suggest(q, s, source, target, model="tiny", translation="")
    store.close()
    return str(path)


def month_not_in_dev(data_dir):
    """The number (1-12) of the first month that no source line of the data dir's dev split names."""
    dev = open(os.path.join(data_dir, "eval.1"), encoding="utf-8").read()
    return next(number for number, month in enumerate(GERMAN_MONTHS, 1) if month not in dev)


def house_style_pairs(month, count, seed=5):
    """count dates in one month, whose English translation writes HOUSE_WORD for the month's name."""
    rng = random.Random(seed)
    pairs = [date_pair(rng.randint(1800, 2099), month, rng.randint(1, 28), rng.randrange(3))
             for _ in range(count)]
    return [(german, english.replace(ENGLISH_MONTHS[month - 1], HOUSE_WORD)) for german, english in pairs]


def test_the_held_out_pairs_are_chosen_under_the_seed_with_a_source_texts_pairs_together():
    pairs = [("q%d" % i, "s%d" % i) for i in range(20)] + [("q3", "another s3")]
    trained, held = split_pairs(pairs, 0.2, 1234, "db", ("de", "en"))
    assert (trained, held) == split_pairs(pairs, 0.2, 1234, "db", ("de", "en"))
    assert len(held) in (4, 5) and sorted(trained + held) == sorted(pairs)
    assert {q for q, _ in trained}.isdisjoint(q for q, _ in held)
    assert trained == [pair for pair in pairs if pair in trained]  # the database's order
    assert split_pairs(pairs, 0.2, 1, "db", ("de", "en")) != (trained, held)
    assert pairs_needed(0.2) == 3 and pairs_needed(0.5) == 2 and pairs_needed(0.9) == 6


def test_suggestions_in_a_house_style_are_learned_and_kept(tiny_model, tmp_path, capsys):
    run, data_dir = tiny_model
    month = month_not_in_dev(data_dir)
    db = suggestions_db(tmp_path / "suggestions.db", house_style_pairs(month, 40))
    new = str(tmp_path / "new")
    code, out, err = run_in_process(capsys, "train.py", train.main, "--init_from", run, "--suggestions", db,
                                    "--logdir", new, *FINE_TUNE)
    assert code == 0, err
    results = json.load(open(os.path.join(new, "corrections.json")))
    before, after = results["before"], results["after"]
    assert results["kept"] and results["reason"] is None
    assert (results["pairs"], results["trained"], results["held_out"], results["replayed"]) == (40, 32, 8, 128)
    assert after["held_out_bleu"] > before["held_out_bleu"] + 10
    assert before["dev_bleu"] - after["dev_bleu"] <= 0.5
    assert before["checkpoint"].startswith(run) and after["checkpoint"].startswith(new)
    assert "held-out suggestions" in out and "kept: %s" % new in out
    assert not os.path.exists(os.path.join(new, "REJECTED.json"))
    assert json.load(open(os.path.join(new, "hparams.json")))["data_dir"] == os.path.join(new, "corrections_data")

    # NEW is a model like any other now, and writes the month in the house style
    german, _ = date_pair(1912, month, 3, 1)
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", new, german)
    assert code == 0 and HOUSE_WORD in out, (out, err)


def test_a_fine_tune_that_costs_too_much_dev_bleu_is_rejected_and_refused(tiny_model, tmp_path, capsys):
    run, _ = tiny_model
    rng = random.Random(3)
    # one sentence pattern in a wording of its own, and nothing replayed: the model forgets the dates of dev
    pairs = [number_pair(rng.randint(1, 999999), 2) for _ in range(20)]
    db = suggestions_db(tmp_path / "suggestions.db",
                        [(german, english.replace("He counts to", "Counted:")) for german, english in pairs])
    new = str(tmp_path / "new")
    code, _, err = run_in_process(capsys, "train.py", train.main, "--init_from", run, "--suggestions", db,
                                  "--logdir", new, "--replay_ratio", "0", "--max_dev_drop", "0", *FINE_TUNE[2:],
                                  "--max_steps", "60", "--lr", "0.01", "--batch_size", "300")
    assert code == REJECTED_EXIT_CODE == 3 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("rejected:")]
    assert len(lines) == 1 and "dev BLEU dropped by" in lines[0] and "--max_dev_drop 0" in lines[0]
    rejected = json.load(open(os.path.join(new, "REJECTED.json")))
    assert "dev BLEU dropped by" in rejected["reason"] and run in rejected["remedy"]
    assert json.load(open(os.path.join(new, "corrections.json")))["kept"] is False

    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", new, "Die Zahl ist drei.")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "is marked rejected" in err and "dev BLEU dropped by" in err
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", run, "--ensemble", new,
                                    "Die Zahl ist drei.")  # nor as a member of an ensemble
    assert code == 2 and out == "" and err.strip().count("\n") == 0 and "--ensemble %s: " % new in err
    assert "is marked rejected" in err


def test_suggestions_need_a_run_to_fine_tune(tmp_path, capsys):
    db = suggestions_db(tmp_path / "suggestions.db", [("eins", "one")] * 3)
    code, _, err = run_in_process(capsys, "train.py", train.main, "--suggestions", db, "--logdir",
                                  tmp_path / "new")
    assert code == 2 and "Traceback" not in err and err.strip().count("\n") == 0
    assert "give --init_from RUN" in err
    code, _, err = run_in_process(capsys, "train.py", train.main, "--replay_ratio", "2", "--logdir", tmp_path / "new")
    assert code == 2 and "--replay_ratio is for a fine-tune on suggestions" in err
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.parametrize("case", ["missing", "too few", "other direction"])
def test_a_database_without_enough_suggestions_is_one_line(tiny_model, tmp_path, capsys, case):
    run, _ = tiny_model
    db = str(tmp_path / "suggestions.db")
    if case == "too few":
        suggestions_db(db, [("Die Zahl ist eins.", "The number is one."), ("zwei", "two")])
    elif case == "other direction":
        suggestions_db(db, [("one", "eins"), ("two", "zwei"), ("three", "drei")], "en", "de")
    new = str(tmp_path / "new")
    code, _, err = run_in_process(capsys, "train.py", train.main, "--init_from", run, "--suggestions", db,
                                  "--logdir", new)
    assert code == 2 and "Traceback" not in err and err.strip().count("\n") == 0
    expected = {"missing": "--suggestions %s not found" % db,
                "too few": "holds 2 suggestion pairs de->en (not rejected), but --suggestions_heldout 0.2 needs "
                           "at least 3",
                "other direction": "holds 0 suggestion pairs de->en"}[case]
    assert expected in err
    assert not os.path.exists(new)
