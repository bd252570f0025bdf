"""The recipe's choice of model (scripts/recipe_table.py, scripts/recipe.py), its table file, the run that
scripts/add_recipe_run.py adds to it and the tables scripts/plot_recipe.py writes. Speeds are injected: nothing here
is timed, and nothing trains."""
import dataclasses
import io
import json
import math
import re
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import add_recipe_run
import bench_train  # noqa: E402
import plot_recipe  # noqa: E402
import prepro  # noqa: E402
import recipe  # noqa: E402
import recipe_table  # noqa: E402
from toolkit import version  # noqa: E402
from data_load import epoch_pairs, trained_target_tokens  # noqa: E402
from toolkit.data.datadir import fingerprint, load_manifest  # noqa: E402
from toolkit.base.errors import UserError  # noqa: E402
from hparams import Hparams  # noqa: E402
from in_process import run_in_process  # noqa: E402
from toolkit.training.logdir import save_hparams  # noqa: E402

MULTI30K_DIR = ROOT.parent / "shared/data/multi30k"
TINY = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "300"]


def run(candidate, tokens, bleu, steps=100):
    return {"candidate": candidate, "target_tokens": tokens, "steps": steps, "batch_size": 2048, "dev_bleu": bleu,
            "precision": "fp32", "cpu": "test CPU", "command": "bash scripts/multi30k.sh 60", "source": "a test"}


def make_table(runs, names=("small", "big", "empty")):
    """A table of candidates `names` (small: d_model 256, others 512) with the given runs."""
    candidates = [{"name": name, "flags": ["--d_model", "256" if name == "small" else "512"]} for name in names]
    return {"train_flags": ["--lr_schedule", "linear"], "candidates": candidates, "runs": runs}


#: small learns faster early, big ends higher: measured at 1 M and 10 M target tokens each.
SMALL_AND_BIG = make_table([run("small", 1e6, 30.0), run("small", 1e7, 36.0),
                            run("big", 1e6, 25.0), run("big", 1e7, 38.0)])


def choose_with_speeds(table, speeds, seconds):
    predicted = {name: recipe_table.predict(table, name, speed, seconds) for name, speed in speeds.items()}
    return recipe_table.choose(predicted, list(speeds))[0], predicted


# ------------------------------------------------------------------------------------------------
# Prediction and choice (scripts/recipe_table.py)


def test_runs_within_ten_percent_of_a_budget_are_one_point_at_their_geometric_mean():
    runs = [run("a", 1.15e6, 30.0), run("a", 1e6, 20.0), run("a", 4e6, 34.0), run("a", 1.08e6, 22.0)]
    # 1.08 M is within 10% of 1 M; 1.15 M is not, and starts a point of its own (no chaining through 1.08 M)
    points = recipe_table.budget_points(runs)
    assert [bleu for _, bleu in points] == [21.0, 30.0, 34.0]
    assert points[0][0] == pytest.approx(math.sqrt(1.08) * 1e6, rel=1e-12)
    assert [tokens for tokens, _ in points[1:]] == [1.15e6, 4e6]


def test_dev_bleu_is_linear_in_log_tokens_between_points_and_held_beyond_the_largest():
    points = [(1e6, 20.0), (1e7, 30.0), (1e8, 32.0)]
    assert recipe_table.predict_bleu(points, 10 ** 6.5)[0] == pytest.approx(25.0)
    assert recipe_table.predict_bleu(points, 10 ** 7.5)[0] == pytest.approx(31.0)
    assert recipe_table.predict_bleu(points, 1e6) == (20.0, "interpolated between 1.00 M and 10.00 M tokens")
    assert recipe_table.predict_bleu(points, 1e7)[0] == 30.0
    assert recipe_table.predict_bleu(points, 1e8) == (32.0, "at its largest measured budget, 100.00 M tokens")
    assert recipe_table.predict_bleu(points, 1e9) == (32.0, "at its largest measured budget, 100.00 M tokens "
                                                            "(held)")


def test_no_prediction_below_the_smallest_measured_budget_or_without_runs():
    assert recipe_table.predict_bleu([(1e6, 20.0)], 9.99e5) == (
        None, "below its smallest measured budget (1.00 M tokens)")
    assert recipe_table.predict_bleu([], 1e7) == (None, "no measured runs")


def test_a_faster_small_model_beats_a_slower_big_one_that_trains_too_few_tokens():
    # 10,000 s: small trains 10 M tokens (36.0), big 1 M (25.0)
    chosen, predicted = choose_with_speeds(SMALL_AND_BIG, {"small": 1000.0, "big": 100.0}, 10000)
    assert chosen == "small"
    assert (predicted["small"].tokens, predicted["small"].bleu) == (1e7, 36.0)
    assert (predicted["big"].tokens, predicted["big"].bleu) == (1e6, 25.0)


def test_a_big_model_wins_when_the_machine_buys_it_enough_tokens_even_if_slower():
    # 10,000 s: small 10^7.5 tokens, held at 36.0; big 10^7, 38.0
    chosen, predicted = choose_with_speeds(SMALL_AND_BIG, {"small": 10 ** 3.5, "big": 1000.0}, 10000)
    assert chosen == "big"
    assert predicted["small"].bleu == 36.0 and predicted["small"].basis.endswith("(held)")
    # at 10^6.5 tokens each: small 33.0 against big 31.5
    assert choose_with_speeds(SMALL_AND_BIG, {"small": 10 ** 2.5, "big": 10 ** 2.5}, 10000)[0] == "small"


def test_a_candidate_without_runs_or_outside_its_range_is_never_chosen():
    table = make_table([run("small", 1e6, 30.0), run("big", 1e7, 40.0)])
    # big would train 2 M tokens: below its only measured budget, so small (held at 30.0) is chosen over it
    chosen, predicted = choose_with_speeds(table, {"small": 100.0, "big": 200.0, "empty": 1e6}, 10000)
    assert chosen == "small" and predicted["big"].bleu is None and predicted["empty"].bleu is None
    assert predicted["empty"].basis == "no measured runs"


def test_ties_go_to_the_candidate_listed_first_and_no_prediction_to_the_first():
    table = make_table([run("small", 1e6, 30.0), run("big", 2e6, 30.0)])
    assert choose_with_speeds(table, {"small": 1000.0, "big": 1000.0, "empty": 1000.0}, 10000)[0] == "small"
    assert choose_with_speeds(table, {"big": 1000.0, "small": 1000.0}, 10000)[0] == "big"
    predicted = {name: recipe_table.predict(table, name, 1.0, 10) for name in ("big", "small", "empty")}
    assert recipe_table.choose(predicted, ["big", "small", "empty"]) == (
        "big", "no candidate has a prediction for its budget: the first one listed")


# ------------------------------------------------------------------------------------------------
# The table file


def write_table(tmp_path, table):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("change, message", [
    (lambda t: t["runs"].append(run("huge", 1e6, 1.0)),
     "a run names the candidate huge, which is not among the candidates (small, big, empty)"),
    (lambda t: t["candidates"][1]["flags"].append("--d_modle"),
     "the flags of candidate big are not train.py's: unrecognized arguments: --d_modle"),
    (lambda t: t["candidates"][0]["flags"].extend(["--num_heads", "7"]),
     "the flags of candidate small are not train.py's: --num_heads 7 must divide --d_model 256"),
    (lambda t: t["candidates"].append(dict(t["candidates"][0])), "a candidate name appears twice"),
    (lambda t: t["runs"].append({"candidate": "small", "target_tokens": 5}), "lacks steps, batch_size, dev_bleu"),
    (lambda t: t["runs"].append(run("small", 0, 30.0)), "needs target_tokens above 0"),
    (lambda t: t.pop("runs"), "an object with the lists train_flags, candidates and runs"),
    (lambda t: t["candidates"][2].update(vocab_size="4k"),
     'the vocab_size of candidate empty must be a whole number of BPE pieces (prepro.py --vocab_size), not "4k"'),
])
def test_a_table_that_is_wrong_is_refused_with_what_is_wrong(tmp_path, change, message):
    table = make_table([run("small", 1e6, 30.0)])
    change(table)
    path = write_table(tmp_path, table)
    with pytest.raises(UserError, match="^%s: " % re.escape(path)) as error:
        recipe_table.load_table(path)
    assert message in str(error.value)


def test_the_table_file_round_trips_with_one_line_per_candidate_and_run(tmp_path):
    table = make_table([run("small", 1e6, 30.0), run("big", 2e6, 31.5)])
    text = recipe_table.format_table(table)
    assert json.loads(text) == table
    # {, train_flags, candidates: [ + 3 + ], runs: [ + 2 + ], }
    assert len(text.splitlines()) == 12
    assert text.splitlines()[3] == "    " + json.dumps(table["candidates"][0]) + ","
    assert recipe_table.format_table(recipe_table.load_table()) == Path(recipe_table.TABLE_PATH).read_text()


def test_the_shipped_table_lists_todays_recipe_first():
    table = recipe_table.load_table()
    assert recipe_table.train_flags(table, "d256-ff512-drop0.1") == [
        "--d_model", "256", "--d_ff", "512", "--dropout_rate", "0.1", "--num_blocks", "3", "--num_heads", "8",
        "--batch_size", "2048", "--lr", "1e-3", "--warmup_steps", "800", "--lr_schedule", "linear",
        "--num_epochs", "1000", "--eval_every", "0", "--keep_checkpoints", "10"]
    assert recipe_table.candidate_names(table)[0] == "d256-ff512-drop0.1"


def training_pairs(data_dir, hp):
    """pairs_of(epoch) of the training split as the run of hp trains it (data_load.epoch_pairs)."""
    return epoch_pairs(data_dir, load_manifest(data_dir), "train", hp.maxlen1, hp.maxlen2, hp.truncate,
                       hp.bpe_dropout, hp.seed)


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K_DIR.is_dir(), reason=f"{MULTI30K_DIR} is absent")
def test_the_shipped_runs_hold_the_target_tokens_of_their_steps(tmp_path):
    table = recipe_table.load_table()
    base = str(tmp_path / "multi30k")
    for vocab_size in recipe.vocab_sizes(table, recipe_table.candidate_names(table)):
        data_dir = recipe.vocab_data_dir(base, vocab_size)
        assert prepro.main(recipe.prepro_command(data_dir, vocab_size)[2:]) == 0
    for row in table["runs"]:
        data_dir = recipe.candidate_data_dir(table, row["candidate"], base)
        hp = Hparams().parser.parse_args(recipe_table.train_flags(table, row["candidate"]))
        assert row["target_tokens"] == trained_target_tokens(training_pairs(data_dir, hp), row["steps"], hp.batch_size, hp.batch_type,
                                                             hp.seed, hp.bucket_growth, hp.accum_steps)


# ------------------------------------------------------------------------------------------------
# Measuring and choosing in scripts/recipe.py


def test_measuring_is_skipped_only_when_it_can_not_change_the_choice():
    def names_with_runs(*names):
        return make_table([run(name, 1e6, 30.0) for name in names])
    assert recipe.choice_without_measuring(names_with_runs("small"), ["small", "big", "empty"]) == "small"
    assert recipe.choice_without_measuring(names_with_runs(), ["small", "big", "empty"]) == "small"
    assert recipe.choice_without_measuring(names_with_runs("big"), ["big"]) == "big"
    assert recipe.choice_without_measuring(names_with_runs("big"), ["empty"]) == "empty"
    # big alone has runs but small is listed first: small is the choice when big's budget is below its runs
    assert recipe.choice_without_measuring(names_with_runs("big"), ["small", "big"]) is None
    assert recipe.choice_without_measuring(names_with_runs("small", "big"), ["small", "big"]) is None


class FakeMeasure:
    """measure_speeds' measure(flags, seconds, count_build) on a fake clock: each candidate (by --d_model) builds
    its graph in build[d_model] s and steps in steps[d_model] s; a measurement whose counted time is longer than it
    may take is cut off at its limit, as Bench cuts the measuring process."""

    def __init__(self, build, steps):
        self.build, self.steps, self.now, self.calls = build, steps, 0.0, []

    def __call__(self, flags, seconds, count_build):
        d_model = flags[1]
        self.calls.append((d_model, seconds, count_build))
        uncounted = 0.0 if count_build else self.build[d_model]
        took = self.build[d_model] + self.steps[d_model] - uncounted
        if took > seconds:
            self.now += seconds + uncounted
            return recipe.Speed(None, recipe.OUT_OF_TIME, None, uncounted)
        self.now += took + uncounted
        return recipe.Speed(float(d_model), "measured", {"d_model": d_model}, uncounted)


def test_a_candidate_is_measured_only_when_the_table_can_predict_it_at_the_budget_estimated_from_the_first():
    # the first (small) is the reference; mid's runs start at 2 M tokens, big's at 10 M
    table = make_table([run("small", 1e6, 30.0), run("mid", 2e6, 33.0), run("big", 1e7, 38.0)],
                       names=("small", "empty", "mid", "big"))
    table["candidates"][2]["flags"] = ["--d_model", "384"]
    measure = FakeMeasure({"256": 5, "384": 6, "512": 7}, {"256": 1, "384": 1, "512": 1})
    estimates = {"empty": 9e9, "mid": 1.7e6, "big": 7.9e6}  # 1.25 x: mid 2.125 M (>= 2 M), big 9.875 M (< 10 M)
    seen = []

    def estimate_tokens(name, first):
        seen.append((name, first.tokens_per_s))
        return estimates[name]
    speeds = recipe.measure_speeds(table, ["small", "empty", "mid", "big"], 100, measure, estimate_tokens,
                                   clock=lambda: measure.now)
    assert measure.calls == [("256", 100, False), ("384", 99, True)]  # small's 5 s build is not counted
    assert seen == [("empty", 256.0), ("mid", 256.0), ("big", 256.0)]
    assert speeds["mid"].tokens_per_s == 384.0
    assert speeds["empty"].note == "not measured: no measured runs in the table"
    assert speeds["big"] == recipe.Speed(
        None, "not measured: the table has no prediction below 10.00 M tokens (about 7.90 M estimated here)")
    # without an estimate (the first could not be measured) nothing is left out for it
    measure.calls.clear()
    recipe.measure_speeds(table, ["small", "big"], 100, measure, lambda name, first: None, clock=lambda: measure.now)
    assert [d_model for d_model, _, _ in measure.calls] == ["256", "512"]


def test_the_candidates_predicted_highest_are_measured_first_and_the_allowance_leaves_out_the_rest():
    # mid, big and last (listed last) learn alike, last highest; empty has no runs and no prediction
    table = make_table([run(name, 1e6, bleu - 2) for name, bleu in (("mid", 30.0), ("big", 34.0),
                                                                     ("last", 36.0))]
                       + [run(name, 1e7, bleu + 3) for name, bleu in (("mid", 30.0), ("big", 34.0),
                                                                      ("last", 36.0))],
                       names=("small", "empty", "mid", "big", "last"))
    for candidate, d_model in zip(table["candidates"], ("256", "320", "384", "512", "640")):
        candidate["flags"] = ["--d_model", d_model]
    estimates = {"empty": 5e6, "mid": 5.5e6, "big": 5.5e6, "last": 5.5e6}
    mid, big, last = (recipe_table.predict_at(table, name, 5.5e6).bleu for name in ("mid", "big", "last"))
    assert mid < big < last
    assert recipe.most_promising_first(table, ["empty", "mid", "big", "last"], estimates) == [
        "last", "big", "mid", "empty"]
    # without estimates, the table's order
    assert recipe.most_promising_first(table, ["mid", "big", "last"], dict.fromkeys(estimates)) == [
        "mid", "big", "last"]
    # allowance 9 s, 10 with the first's build (1 s, not counted): the first steps 1 s, last and big build and
    # step 4 s each, and nothing is left for mid
    steps = {"256": 1, "320": 1, "384": 3, "512": 3, "640": 3}
    measure = FakeMeasure(dict.fromkeys(steps, 1), steps)
    speeds = recipe.measure_speeds(table, ["small", "empty", "mid", "big", "last"], 9, measure,
                                   lambda name, first: estimates[name], clock=lambda: measure.now)
    assert [d_model for d_model, _, _ in measure.calls] == ["256", "640", "512"]
    assert speeds["mid"].note == recipe.OUT_OF_TIME
    assert (speeds["last"].tokens_per_s, speeds["big"].tokens_per_s) == (640.0, 512.0)


def test_the_allowance_cuts_measuring_and_the_first_graph_build_is_not_counted():
    table = make_table([run(name, 1e6, 30.0) for name in ("small", "mid", "big", "last")],
                       names=("small", "mid", "big", "last"))
    for candidate, d_model in zip(table["candidates"], ("256", "384", "512", "640")):
        candidate["flags"] = ["--d_model", d_model]
    # allowance 24 s: small builds 30 s (not counted) and steps 20 s; mid gets the 4 s left and is cut off there
    measure = FakeMeasure({"256": 30, "384": 3, "512": 3, "640": 3}, {"256": 20, "384": 3, "512": 3, "640": 3})
    speeds = recipe.measure_speeds(table, ["small", "mid", "big", "last"], 24, measure, lambda name, first: 1e7,
                                   clock=lambda: measure.now)
    assert measure.calls == [("256", 24, False), ("384", 4, True)]
    assert speeds["small"] == recipe.Speed(256.0, "measured", {"d_model": "256"}, 30)
    assert [speeds[name].note for name in ("mid", "big", "last")] == [recipe.OUT_OF_TIME] * 3
    assert measure.now == 54  # 30 s of build + the 24 s allowed
    predicted = recipe.predictions(table, speeds, 1000)
    assert (predicted["small"].tokens, predicted["small"].bleu) == (256000.0, None)
    assert predicted["last"] == recipe_table.Prediction(None, None, None, recipe.OUT_OF_TIME)


def test_a_speed_is_estimated_from_the_first_candidates_by_the_ratio_of_model_flops():
    # d_model 2, d_ff 3, vocabulary 5, sentences of 1 source and 1 target token: one block 188 FLOPs a forward
    # pass, two blocks 2 * 168 + 20 = 356 (tests/test_benches.py has the hand count)
    table = {"train_flags": ["--d_model", "2", "--d_ff", "3", "--num_heads", "1"], "runs": [],
             "candidates": [{"name": "one", "flags": ["--num_blocks", "1"]},
                            {"name": "two", "flags": ["--num_blocks", "2"]}]}
    first = recipe.Speed(712.0, "measured", {"real_src_tokens_per_sentence": 1, "real_tgt_tokens_per_sentence": 1,
                                             "vocab_size": 5})
    assert recipe.estimated_speed(table, "two", "one", first) == pytest.approx(712.0 * 188 / 356)
    assert recipe.estimated_speed(table, "one", "one", first) == pytest.approx(712.0)


def test_the_matmul_reading_runs_in_a_process_of_its_own():
    assert recipe.matmul_gflops() > 0  # the results' reading, and the speed estimate's with nothing measured


def test_with_nothing_measured_a_speed_is_a_share_of_the_matmul_by_model_flops():
    # the table of the test above: one block, 188 FLOPs a forward pass on a pair of 1 and 1 tokens; 3 passes a step
    table = {"train_flags": ["--d_model", "2", "--d_ff", "3", "--num_heads", "1"], "runs": [],
             "candidates": [{"name": "one", "flags": ["--num_blocks", "1"]}]}
    assert recipe.matmul_speed(table, "one", (5, 1, 1), 100.0) == pytest.approx(recipe.MATMUL_SHARE * 100e9 / 564)


def test_an_rdrop_candidate_costs_twice_the_flops_of_its_plain_twin_per_target_token():
    # the tables of the tests above: 188 FLOPs a forward pass, 564 a training step; R-Drop runs the rows twice
    table = {"train_flags": ["--d_model", "2", "--d_ff", "3", "--num_heads", "1", "--num_blocks", "1"], "runs": [],
             "candidates": [{"name": "plain", "flags": []}, {"name": "rdrop", "flags": ["--rdrop", "5"]},
                            {"name": "rdrop0", "flags": ["--rdrop", "0"]}]}
    lengths = (5, 1, 1)
    assert recipe.training_flops_per_token(table, "plain", lengths) == 564
    assert recipe.training_flops_per_token(table, "rdrop", lengths) == 2 * 564
    assert recipe.training_flops_per_token(table, "rdrop0", lengths) == 564
    # so an unmeasured R-Drop candidate is estimated at half its twin's speed, by either estimate
    first = recipe.Speed(712.0, "measured", {"real_src_tokens_per_sentence": 1, "real_tgt_tokens_per_sentence": 1,
                                             "vocab_size": 5})
    assert recipe.estimated_speed(table, "rdrop", "plain", first) == pytest.approx(356.0)
    assert recipe.estimated_speed(table, "plain", "rdrop", first) == pytest.approx(2 * 712.0)
    assert recipe.matmul_speed(table, "rdrop", lengths, 100.0) == pytest.approx(
        recipe.matmul_speed(table, "plain", lengths, 100.0) / 2)


#: small trains on the default vocabulary (8,000 pieces), big on one of 4,000, empty names the default.
VOCABULARIES = make_table([run("small", 1e6, 30.0), run("small", 1e7, 36.0),
                           run("big", 1e6, 25.0), run("big", 1e7, 38.0)])
VOCABULARIES["candidates"][1]["vocab_size"] = 4000
VOCABULARIES["candidates"][2]["vocab_size"] = 8000


def test_a_candidate_of_another_vocabulary_has_a_data_dir_of_its_own_and_is_measured_on_it():
    assert [recipe_table.vocab_size(VOCABULARIES, name) for name in ("small", "big", "empty")] == [8000, 4000, 8000]
    assert recipe.vocab_sizes(VOCABULARIES, ["small", "big", "empty"]) == [8000, 4000]
    assert recipe.vocab_sizes(VOCABULARIES, ["empty", "small"]) == [8000]
    assert [recipe.candidate_data_dir(VOCABULARIES, name, "data/multi30k_en_de") for name in ("small", "big")] == [
        "data/multi30k_en_de", "data/multi30k_en_de_v4000"]
    assert recipe.prepro_command("d_v4000", 4000)[2:6] == ["--vocab_size", "4000", "--data_dir", "d_v4000"]
    measured = []

    def measure(flags, seconds, count_build):
        measured.append(flags)
        return recipe.Speed(1000.0, "measured", {})
    recipe.measure_speeds(VOCABULARIES, ["small", "big"], 100, measure, lambda name, first: 1e7, data_dir="d")
    assert measured == [recipe_table.train_flags(VOCABULARIES, "small") + ["--data_dir", "d"],
                        recipe_table.train_flags(VOCABULARIES, "big") + ["--data_dir", "d_v4000"]]


def test_a_speed_estimated_across_vocabularies_counts_the_sentences_in_the_candidates_own_pieces():
    # the same model on 8,000 and 4,000 pieces: the measured lengths (10 and 10) scaled by the ratio of the two
    # training splits' mean lengths, 24 / 20 and 30 / 20
    table = {"train_flags": ["--d_model", "2", "--d_ff", "3", "--num_heads", "1", "--num_blocks", "1"], "runs": [],
             "candidates": [{"name": "v8k", "flags": []}, {"name": "v4k", "flags": [], "vocab_size": 4000}]}
    corpus = {8000: (8000, 20.0, 20.0), 4000: (4000, 24.0, 30.0)}
    measured = (8000, 10.0, 10.0)
    assert recipe.candidate_lengths(table, "v4k", "v8k", measured, corpus.get) == (4000, 12.0, 15.0)
    assert recipe.candidate_lengths(table, "v8k", "v8k", measured, None) == measured
    first = recipe.Speed(1000.0, "measured", {"real_src_tokens_per_sentence": 10.0,
                                              "real_tgt_tokens_per_sentence": 10.0, "vocab_size": 8000})
    assert recipe.estimated_speed(table, "v4k", "v8k", first, corpus.get) == pytest.approx(
        1000.0 * recipe.training_flops_per_token(table, "v8k", measured)
        / recipe.training_flops_per_token(table, "v4k", (4000, 12.0, 15.0)))


def test_a_candidate_that_could_not_be_measured_is_estimated_from_what_was():
    first = recipe.Speed(1000.0, "measured", {"vocab_size": 5})
    speeds = {"small": first, "mid": recipe.Speed(None, recipe.OUT_OF_TIME),
              "big": recipe.Speed(None, "measurement failed: a bug"),
              "empty": recipe.Speed(None, "not measured: no measured runs in the table")}
    estimated = recipe.estimate_unmeasured(speeds, list(speeds), lambda name, first: (first.tokens_per_s / 2, "est."))
    assert estimated["small"] is first and estimated["empty"] == speeds["empty"]
    assert estimated["mid"] == recipe.Speed(500.0, "est. (%s)" % recipe.OUT_OF_TIME, estimated=True)
    assert estimated["big"] == recipe.Speed(500.0, "est. (measurement failed: a bug)", estimated=True)
    predicted = recipe.predictions(SMALL_AND_BIG, {"big": estimated["big"]}, 2000)  # 1 M tokens: big's first run
    assert predicted["big"].bleu == 25.0 and predicted["big"].basis.startswith("speed est. (measurement failed")


def test_what_was_measured_predicted_and_chosen_is_printed_as_a_table():
    predicted = {"small": recipe_table.Prediction(1234.4, 5.678e6, 38.126, "interpolated"),
                 "big": recipe_table.Prediction(None, None, None, "not measured")}
    assert recipe.choice_lines(predicted, "small", "the highest predicted dev BLEU") == [
        "candidate  tokens/s here  predicted tokens  predicted dev BLEU  how",
        "small               1234            5.68 M               38.13  interpolated",
        "big                    -                 -                   -  not measured",
        "chose small: the highest predicted dev BLEU"]


#: A measuring process as Bench reads it: per stdin line, a graph built in "30 s", then a result, or an error for
#: ["refused"], a 60 s wait before the result for ["slow"], a last line of text and its end for ["crash"].
FAKE_BENCH = """
import json, sys, time
for line in iter(sys.stdin.readline, ""):
    flags = json.loads(line)
    if flags == ["crash"]:
        print("ValueError: a bug", flush=True)
        sys.exit(1)
    print("a warning", flush=True)
    print(json.dumps({"graph_build_s": 30.0}), flush=True)
    if flags == ["slow"]:
        time.sleep(60)
    print(json.dumps({"error": "no step was timed"} if flags == ["refused"] else
                     {"real_tgt_tokens_per_s": 1100.0, "epoch_tgt_tokens_per_s": 1000.0, "timed_steps": 3}),
          flush=True)
"""


def test_the_measuring_process_is_read_as_it_prints_and_stopped_when_its_time_is_up(tmp_path):
    log = io.StringIO()
    with recipe.Bench([sys.executable, "-c", FAKE_BENCH], log) as bench:
        # the first graph's build is not counted: its 30 s do not end the 0 s it may take; the speed is the
        # epoch's (its mean batch over the median step time), not that of the few batches timed
        result = {"real_tgt_tokens_per_s": 1100.0, "epoch_tgt_tokens_per_s": 1000.0, "timed_steps": 3}
        assert bench.measure(["fast"], 0.0, False) == recipe.Speed(
            1000.0, "an epoch's mean batch over the median of 3 steady-state steps", result, 30.0)
        assert bench.measure(["refused"], 60.0, True) == recipe.Speed(None, "measurement failed: no step was timed")
        assert bench.measure(["slow"], 0.5, True) == recipe.Speed(None, recipe.OUT_OF_TIME)
        assert bench.proc.returncode == -signal.SIGKILL  # killed at once: a step in progress is not waited for
        assert bench.measure(["fast"], 60.0, True) == recipe.Speed(None, recipe.OUT_OF_TIME)
    assert log.getvalue().startswith('a warning\n{"graph_build_s": 30.0}\n')
    with recipe.Bench([sys.executable, "-c", FAKE_BENCH], log) as bench:
        assert bench.measure(["crash"], 60.0, True) == recipe.Speed(None, "measurement failed: ValueError: a bug")
        assert bench.measure(["fast"], 60.0, True) == recipe.Speed(None, "measurement failed: ValueError: a bug")


def test_bench_train_measures_each_model_of_its_stdin_in_a_graph_of_its_own(small_numbers_dir, monkeypatch, capsys,
                                                                           tmp_path):
    # with --max_steps 1 and no warm-up no step is timed: each model is built, then refused with the reason, and
    # the next one is measured (a model that is measured is tests/test_benches.py's, through the same function);
    # no matmul is read, which would cost seconds of the recipe's measuring before the first result. A line's
    # --data_dir is the one its model trains on (here one that was never prepared)
    matmuls = []
    monkeypatch.setattr(bench_train, "matmul_gflops", lambda config, dtype: matmuls.append(dtype) or 1.0)
    missing = str(tmp_path / "data_v4000")
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(flags) + "\n" for flags in (
        ["--d_model", "32"], ["--d_model", "16"], ["--d_model", "16", "--data_dir", missing]))))
    graphs = []
    real_measure = bench_train.measure
    monkeypatch.setattr(bench_train, "measure", lambda hp, *args, **kwargs: graphs.append(hp.d_model) or real_measure(
        hp, *args, **kwargs))
    bench_train.main(["--data_dir", small_numbers_dir, "--steps", "1", "--warmup", "0", "--max_steps", "1",
                      "--flags_from_stdin"] + TINY[2:] + ["--num_heads", "2", "--threads", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    no_step = "no step of the 1 after warm-up came on a batch shape seen before, so none was timed: raise --max_steps"
    assert [list(line) for line in lines] == [["graph_build_s"], ["error"], ["graph_build_s"], ["error"], ["error"]]
    assert lines[1] == lines[3] == {"error": no_step}
    assert lines[4]["error"].startswith("%s/manifest.json not found" % missing)
    assert graphs == [32, 16] and matmuls == []


def test_candidates_restrict_the_choice_in_the_tables_order_and_unknown_names_are_refused(capsys, tmp_path):
    table = make_table([])
    assert recipe.allowed_candidates(table, "empty, small") == ["small", "empty"]
    assert recipe.allowed_candidates(table, None) == ["small", "big", "empty"]
    logdir = tmp_path / "run"
    code, out, err = run_in_process(capsys, "recipe.py", recipe.main, "--candidates", "small,huge",
                                    "--table", write_table(tmp_path, table), "--logdir", logdir)
    assert code == 2 and out == "" and not logdir.exists()
    assert err == ("error: --candidates small,huge: no such candidate huge; the table's candidates are small, "
                   "big, empty\n")


class FakeBench:
    """recipe.Bench without a process: --d_model 256 trains 1000 target tokens/s here, any other 900; the first
    graph build, not counted, takes 2 s."""

    def __init__(self, command, log):
        assert command[-1] == "--flags_from_stdin"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def measure(self, flags, seconds, count_build):
        result = {"real_src_tokens_per_sentence": 14.0, "real_tgt_tokens_per_sentence": 15.0, "vocab_size": 8000}
        return recipe.Speed(1000.0 if flags[1] == "256" else 900.0, "median of 3 steady-state steps", result,
                            0.0 if count_build else 2.0)


def fake_phases(commands, logdir, train_output):
    """recipe.run in place of prepro.py, train.py and test.py: each command goes to commands, and each phase leaves
    behind what the recipe reads of it (train.py's output and hparams.json, test.py's BLEU: 30 + the beam size)."""
    def run_phase(command, log):
        commands.append(command)
        if command[1] == "train.py":
            (logdir / "hparams.json").write_text('{"precision": "fp32"}', encoding="utf-8")
            return train_output, 5
        if command[1] == "test.py":
            testdir = Path(command[command.index("--testdir") + 1])
            testdir.mkdir()
            beam = int(command[command.index("--beam_size") + 1])
            (testdir / "results.json").write_text('{"bleu": %d}' % (30 + beam), encoding="utf-8")
        return "", 1
    return run_phase


def test_the_recipe_trains_the_chosen_candidate_and_records_what_it_measured_and_predicted(tmp_path, monkeypatch,
                                                                                           capsys):
    commands = []
    logdir = tmp_path / "run"
    monkeypatch.setattr(recipe, "run", fake_phases(commands, logdir, "epoch 1 | step 10 | loss 3.0 | 1000 tgt tok/s\n"
                                                                     "epoch 2 | step 20 | loss 2.5 | 1200 tgt tok/s\n"))
    monkeypatch.setattr(recipe, "matmul_gflops", lambda: 100.0)
    monkeypatch.setattr(recipe, "Bench", FakeBench)
    code, out, err = run_in_process(capsys, "recipe.py", recipe.main, "--minutes", "60", "--data_dir", "d",
                                    "--logdir", logdir, "--table", write_table(tmp_path, SMALL_AND_BIG))
    assert (code, err) == (0, "")
    # about 3,450 s of training: small 3.45 M tokens, 30 + 6 log10(3.45) = 33.2; big 3.1 M, 25 + 13 log10(3.1) = 31.4
    results = json.loads((logdir / "recipe.json").read_text())
    choice = results["choice"]
    assert (choice["chosen"], choice["reason"]) == ("small", "the highest predicted dev BLEU")
    assert choice["flags"] == results["recipe"] == ["--d_model", "256", "--lr_schedule", "linear"]
    train_seconds = choice["candidates"]["small"]["predicted_tokens"] / 1000
    assert choice["candidates"]["big"]["predicted_tokens"] == pytest.approx(900 * train_seconds)
    assert choice["candidates"]["small"]["predicted_dev_bleu"] == pytest.approx(30 + 6 * math.log10(train_seconds
                                                                                                   / 1000))
    assert set(choice["candidates"]) == {"small", "big", "empty"}
    assert choice["candidates"]["empty"]["how"] == "not measured: no measured runs in the table"
    assert (choice["measuring"]["allowance_s"], choice["measuring"]["uncounted_s"]) == (72.0, 2.0)
    train = next(command for command in commands if command[1] == "train.py")
    assert train[2:6] == ["--data_dir", "d", "--logdir", str(logdir)]
    assert train[6:10] == choice["flags"] and train[10] == "--max_minutes"
    assert float(train[11]) == pytest.approx(train_seconds / 60, abs=0.01)
    assert (results["steps"], results["bleu_greedy"], results["bleu_beam"]) == (20, 31, 34)
    assert (results["data_dir"], results["vocab_size"]) == ("d", 8000)
    assert results["train_planned_s"] == pytest.approx(float(train[11]) * 60)
    assert results["seconds"]["train"] == 5
    assert re.search(r"^wall, train +5 s of %.0f s planned$" % results["train_planned_s"], out, re.M)
    assert results["command"] == "python scripts/recipe.py --minutes 60 --data_dir d --logdir %s --table %s" % (
        logdir, tmp_path / "table.json")
    assert "chose small: the highest predicted dev BLEU" in out and "measure and choose" in results["seconds"]


def test_choose_only_prints_the_choice_and_stops_before_training(tmp_path, monkeypatch, capsys):
    commands = []
    monkeypatch.setattr(recipe, "run", lambda command, log: (commands.append(command), ("", 1))[1])
    monkeypatch.setattr(recipe, "Bench", FakeBench)
    logdir = tmp_path / "run"
    logdir.mkdir()  # a logdir that exists is no error: nothing is written there
    code, out, err = run_in_process(capsys, "recipe.py", recipe.main, "--minutes", "60", "--data_dir", "d",
                                    "--logdir", logdir, "--table", write_table(tmp_path, SMALL_AND_BIG),
                                    "--choose_only")
    assert (code, err) == (0, "")
    assert [command[1:] for command in commands][1:] == [["-m", "fast.kernels"]]  # after prepro, before measuring
    assert commands[0][1] == "prepro.py" and list(logdir.iterdir()) == []
    assert re.search(r"^measure: [\d.]+ s \(72\.0 s allowed, 2% of the budget, and 2\.0 s of the first candidate's "
                     r"graph build not counted\)$", out, re.M)
    assert out.rstrip().splitlines()[-1] == "chose small: the highest predicted dev BLEU"


def test_reverse_prepares_english_to_german_in_a_data_dir_and_logdir_of_its_own(tmp_path, monkeypatch, capsys):
    commands = []
    monkeypatch.setattr(recipe, "run", lambda command, log: (commands.append(command), ("", 1))[1])
    monkeypatch.setattr(recipe, "Bench", FakeBench)
    code, _, err = run_in_process(capsys, "recipe.py", recipe.main, "--minutes", "60", "--table",
                                  write_table(tmp_path, SMALL_AND_BIG), "--choose_only", "--reverse")
    assert (code, err) == (0, "")
    prepro_flags = commands[0][2:]
    assert commands[0][1] == "prepro.py" and "--reverse" in prepro_flags
    assert prepro_flags[prepro_flags.index("--data_dir") + 1] == "data/multi30k_en_de"
    args = recipe.parse_args(["--minutes", "20", "--reverse"])
    assert (args.data_dir, args.logdir, args.direction) == ("data/multi30k_en_de", "runs/multi30k_en_de_20m",
                                                            "en->de")
    forward = recipe.parse_args(["--minutes", "20"])
    assert (forward.data_dir, forward.logdir) == ("data/multi30k", "runs/multi30k_20m")
    assert "--reverse" not in recipe.prepro_command("data/multi30k", 8000)


class VocabularyBench(FakeBench):
    """FakeBench whose --d_model 512 trains 10,000 target tokens/s, noting the flags of each measurement."""
    measured = []

    def measure(self, flags, seconds, count_build):
        self.measured.append(flags)
        speed = super().measure(flags, seconds, count_build)
        return dataclasses.replace(speed, tokens_per_s=1e4) if flags[1] == "512" else speed


def test_the_recipe_prepares_measures_and_trains_a_candidate_of_another_vocabulary_on_its_own_data_dir(
        tmp_path, monkeypatch, capsys):
    commands, bench_commands = [], []
    logdir = tmp_path / "run"
    monkeypatch.setattr(recipe, "run", fake_phases(commands, logdir, "epoch 1 | step 10 | loss 3.0 | 1000 tgt tok/s\n"))
    monkeypatch.setattr(recipe, "matmul_gflops", lambda: 100.0)
    monkeypatch.setattr(recipe, "Bench", lambda command, log: bench_commands.append(command) or VocabularyBench(
        command, log))
    monkeypatch.setattr(VocabularyBench, "measured", [])
    monkeypatch.setattr(recipe, "corpus_lengths", lambda data_dir: {"d": (8000, 14.0, 15.0),
                                                                    "d_v4000": (4000, 16.8, 18.0)}[data_dir])
    code, out, err = run_in_process(capsys, "recipe.py", recipe.main, "--minutes", "60", "--data_dir", "d",
                                    "--logdir", logdir, "--table", write_table(tmp_path, VOCABULARIES))
    assert (code, err) == (0, "")
    prepro_runs = [command[2:6] for command in commands if command[1] == "prepro.py"]
    assert prepro_runs == [["--vocab_size", "8000", "--data_dir", "d"], ["--vocab_size", "4000", "--data_dir",
                                                                        "d_v4000"]]
    assert bench_commands[0][bench_commands[0].index("--data_dir") + 1] == "d"  # the first candidate's
    assert [flags[-2:] for flags in VocabularyBench.measured] == [["--data_dir", "d"], ["--data_dir", "d_v4000"]]
    # big trains about 34 M tokens of its own pieces here (its 38.0, held) against small's 3.5 M (33.2)
    results = json.loads((logdir / "recipe.json").read_text())
    assert results["choice"]["chosen"] == "big"
    assert (results["data_dir"], results["vocab_size"]) == ("d_v4000", 4000)
    train = next(command for command in commands if command[1] == "train.py")
    assert train[2:4] == ["--data_dir", "d_v4000"]


class TimedOutBench(FakeBench):
    """A measuring process whose every measurement runs out of time, as one that spent its share compiling."""

    def measure(self, flags, seconds, count_build):
        return recipe.Speed(None, recipe.OUT_OF_TIME)


def test_the_recipe_never_chooses_blind_while_the_table_covers_the_budget(tmp_path, monkeypatch, capsys):
    """With nothing measured, every candidate with runs is estimated from a matmul read here and predicted: the
    choice is the table's, never "the first one listed"."""
    monkeypatch.setattr(recipe, "run", lambda command, log: ("", 1))
    monkeypatch.setattr(recipe, "Bench", TimedOutBench)
    monkeypatch.setattr(recipe, "matmul_gflops", lambda: 100.0)
    monkeypatch.setattr(recipe, "corpus_lengths", lambda data_dir: (8000, 14.0, 15.0))
    code, out, err = run_in_process(capsys, "recipe.py", recipe.main, "--minutes", "60", "--data_dir", "d",
                                    "--table", write_table(tmp_path, SMALL_AND_BIG), "--choose_only")
    assert (code, err) == (0, "")
    assert "the first one listed" not in out and out.rstrip().splitlines()[-1].startswith("chose ")
    for name in ("small", "big"):
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert "estimated as 0.5 of a 100 GFLOP/s matmul read here" in row and " - " not in row, row


# ------------------------------------------------------------------------------------------------
# A finished run added to the table (scripts/add_recipe_run.py)


def finished_run(tmp_path, data_dir, flags, checkpoint, recipe_json=None):
    """A logdir as train.py leaves it, as far as add_recipe_run.py reads it: hparams.json and the checkpoint
    index (no weights)."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    hp = Hparams().parser.parse_args(flags + ["--data_dir", data_dir, "--logdir", str(logdir), "--seed", "7",
                                              "--precision", "bf16", "--max_minutes", "30"])
    manifest = load_manifest(data_dir)
    hp.vocab_size, hp.vocab_sha256 = manifest["vocab_size"], fingerprint(data_dir, manifest)["vocab_sha256"]
    save_hparams(hp, str(logdir))
    (logdir / "checkpoint").write_text('model_checkpoint_path: "%s"\n' % checkpoint, encoding="utf-8")
    if recipe_json:
        (logdir / "recipe.json").write_text(json.dumps(recipe_json), encoding="utf-8")
    return str(logdir)


def tiny_table():
    """Candidates of small_numbers_dir's vocabulary of 200 pieces."""
    return {"train_flags": ["--lr_schedule", "linear"], "runs": [],
            "candidates": [{"name": "wide", "flags": TINY[:2] + ["--d_ff", "128"] + TINY[4:], "vocab_size": 200},
                           {"name": "tiny", "flags": TINY, "vocab_size": 200}]}


def test_a_finished_run_becomes_a_row_with_the_tokens_it_trained(tmp_path, small_numbers_dir, capsys):
    logdir = finished_run(tmp_path, small_numbers_dir, TINY + ["--lr_schedule", "linear", "--eval_every", "0"],
                          "E03_L2.50_B12.34-40", {"command": "python scripts/recipe.py --minutes 30", "machine": {
                              "cpu": "Some CPU", "cores": 2, "isa_flags": ["avx2"]}})
    path = write_table(tmp_path, tiny_table())
    code, out, err = run_in_process(capsys, "add_recipe_run.py", add_recipe_run.main, logdir, "--table", path)
    assert (code, err) == (0, "")
    hp = Hparams().parser.parse_args(TINY + ["--seed", "7"])
    tokens = trained_target_tokens(training_pairs(small_numbers_dir, hp), 40, 300, "tokens", 7)
    assert json.loads(Path(path).read_text())["runs"] == [{
        "candidate": "tiny", "target_tokens": tokens, "steps": 40, "batch_size": 300, "dev_bleu": 12.34,
        "precision": "bf16", "cpu": "Some CPU, 2 cores, avx2", "command": "python scripts/recipe.py --minutes 30",
        "source": "logdir %s" % logdir, "version": version.__version__}]
    assert out == "added to %s: tiny, 40 steps, %.2f M target tokens, dev BLEU 12.34\n" % (path, tokens / 1e6)
    code, _, err = run_in_process(capsys, "add_recipe_run.py", add_recipe_run.main, logdir, "--table", path)
    assert code == 2 and err == "error: %s already has this run (tiny, 40 steps, dev BLEU 12.34)\n" % path


@pytest.mark.parametrize("flags, checkpoint, extra, message", [
    (TINY + ["--lr_schedule", "noam", "--dropout_rate", "0.3"], "E03_L2.50_B12.34-40", [],
     "differs in --dropout_rate 0.3 (candidate: 0.1), --lr_schedule noam (candidate: linear): add a candidate"),
    (TINY + ["--lr_schedule", "linear"], "interrupted-40", [], "interrupted-40, has no dev BLEU in its name"),
    (TINY + ["--lr_schedule", "linear"], "E03_L2.50_B12.34-40", [], "has no recipe.json naming the CPU: pass --cpu"),
    (TINY + ["--lr_schedule", "linear"], "E03_L2.50_B12.34-40", ["--cpu", "X"], "naming the command: pass"),
])
def test_a_run_that_can_not_be_a_row_is_refused_with_the_reason(tmp_path, small_numbers_dir, capsys, flags, checkpoint,
                                                               extra, message):
    logdir = finished_run(tmp_path, small_numbers_dir, flags, checkpoint)
    path = write_table(tmp_path, tiny_table())
    code, out, err = run_in_process(capsys, "add_recipe_run.py", add_recipe_run.main, logdir, "--table", path,
                                    *extra)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert message in err
    assert json.loads(Path(path).read_text())["runs"] == []


def test_a_run_matches_a_candidate_of_its_own_vocabulary_only(tmp_path, small_numbers_dir, capsys):
    # small_numbers_dir's vocabulary has 200 pieces: a candidate of 8,000 (named or by default) is not the run's
    logdir = finished_run(tmp_path, small_numbers_dir, TINY + ["--lr_schedule", "linear"], "E03_L2.50_B12.34-40")
    table = tiny_table()
    for candidate in table["candidates"]:
        candidate.pop("vocab_size")
    table["candidates"][0]["vocab_size"] = 8000
    path = write_table(tmp_path, table)
    code, out, err = run_in_process(capsys, "add_recipe_run.py", add_recipe_run.main, logdir, "--table", path,
                                    "--cpu", "X", "--command", "Y")
    assert code == 2 and out == ""
    assert "the closest, tiny, differs in a vocabulary of 200 pieces (candidate: 8000): add a candidate" in err
    # with the same flags on both vocabularies, the run is the one of its own
    table["candidates"].append({"name": "tiny-v200", "flags": TINY, "vocab_size": 200})
    path = write_table(tmp_path, table)
    code, out, err = run_in_process(capsys, "add_recipe_run.py", add_recipe_run.main, logdir, "--table", path,
                                    "--cpu", "X", "--command", "Y")
    assert (code, err) == (0, "")
    assert [row["candidate"] for row in json.loads(Path(path).read_text())["runs"]] == ["tiny-v200"]


# ------------------------------------------------------------------------------------------------
# The tables and the plot of scripts/plot_recipe.py


def test_the_prediction_table_has_each_budget_with_the_choice_in_bold():
    table = make_table([run("small", 1e6, 30.0), run("small", 1e7, 36.0), run("big", 1e7, 38.0)])
    assert plot_recipe.predictions_markdown(table, [1e6, 10 ** 6.5, 1e8]) == [
        "| candidate | 1 M tokens | 3.16228 M tokens | 100 M tokens |",
        "|---|---|---|---|",
        "| small | **30.00** | **33.00** | 36.00 |",
        "| big | – | – | **38.00** |",
        "| empty | – | – | – |"]


def test_the_tables_go_between_the_markers_of_a_markdown_file(tmp_path):
    doc = tmp_path / "recipe.md"
    doc.write_text("intro\n%s\nold table\n%s\nrest\n" % (plot_recipe.BEGIN, plot_recipe.END), encoding="utf-8")
    plot_recipe.update(str(doc), ["| new |"])
    assert doc.read_text() == "intro\n%s\n| new |\n%s\nrest\n" % (plot_recipe.BEGIN, plot_recipe.END)
    doc.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(UserError, match="must hold the line"):
        plot_recipe.update(str(doc), ["| new |"])
    with pytest.raises(UserError, match="^cannot read %s: No such file or directory$" % re.escape(str(doc) + "x")):
        plot_recipe.update(str(doc) + "x", ["| new |"])


def test_the_plot_is_a_png_of_the_size_asked_for(tmp_path):
    path = tmp_path / "plot.png"
    plot_recipe.plot(SMALL_AND_BIG, str(path))
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")) == (1000, 500)


def test_the_plot_never_replaces_its_table_nor_a_file_that_is_no_png(tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps(SMALL_AND_BIG))
    state = tmp_path / "checkpoint"
    state.write_text("model_checkpoint_path: \"E01-100\"\n")
    for output, line in ((state, "error: --output %s: the plot is a PNG; name a file ending in .png" % state),
                         (tmp_path / "table.png", "error: --output %s is the file given as --table %s: it would be "
                          "replaced by the output; pass another --output" % (tmp_path / "table.png", table))):
        if output.name == "table.png":
            output.symlink_to(table)
        with pytest.raises(UserError) as refusal:
            plot_recipe.main(["--table", str(table), "--output", str(output)])
        assert "error: %s" % refusal.value == line
    assert json.loads(table.read_text()) == SMALL_AND_BIG and state.read_text() == "model_checkpoint_path: \"E01-100\"\n"


def test_bench_train_batches_cycles_the_first_batches_so_every_step_after_their_pass_is_timed(small_numbers_dir,
                                                                                              capsys):
    # --batches 1: the first step sees the only shape, so with no warm-up each of the 4 steps after it is timed
    bench_train.main(["--data_dir", small_numbers_dir, "--steps", "4", "--warmup", "0", "--max_steps", "5",
                      "--batches", "1"] + TINY[2:] + ["--num_heads", "2", "--threads", "1"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (result["new_shape_steps"], result["timed_steps"]) == (1, 4)
