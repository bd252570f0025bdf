"""The Multi30k recipe's candidate settings and the dev BLEU each reached at measured training budgets
(scripts/recipe_table.json), and how scripts/recipe.py chooses among them.

A budget is counted in real (non-pad) target tokens trained: a run of the same flags and seed trains the same
batches on every machine, only faster or slower, so a budget in tokens carries across machines where one in minutes
does not.

A candidate is train.py flags, and "vocab_size" when it trains on a joint BPE vocabulary of other than
DEFAULT_VOCAB_SIZE pieces: scripts/recipe.py prepares a data dir of that vocabulary for it, and a run counts as its
only when trained on that vocabulary (scripts/add_recipe_run.py). Its budgets and speeds count pieces of its own
vocabulary (a smaller one cuts a sentence into more of them): candidates are compared by what the same time buys
each, never token for token.

The prediction for a candidate at a budget of T target tokens, from its measured runs (docs/recipe.md):
  - runs whose budgets lie within POOL_RATIO of the smallest of them are one budget point, their mean dev BLEU at
    the geometric mean of their budgets (repeats of about the same budget, e.g. the same hour on two machines);
  - between two points: linear in log(T);
  - at or above its largest point: that point's BLEU, held (never extrapolated upward: a lower bound, since a
    schedule that decays to 0 at the end of a longer budget has not been seen to end lower);
  - below its smallest point, or without runs: none, and the candidate can not be chosen.
The choice is the candidate with the highest prediction; ties go to the one listed first. When no candidate has
a prediction, the first candidate (the table lists today's recipe first).
"""
import dataclasses
import json
import math
import os
import sys
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from toolkit.base.errors import UserError  # noqa: E402
from hparams import Hparams, range_error  # noqa: E402

TABLE_PATH = os.path.join(ROOT, "scripts", "recipe_table.json")
#: The joint BPE vocabulary of a candidate that names none (prepro.py --vocab_size).
DEFAULT_VOCAB_SIZE = 8000
#: Runs of a candidate whose budgets are within this ratio of the smallest of them form one budget point.
POOL_RATIO = 1.1
#: What every measured run records (add_recipe_run.py writes them, and "version": the toolkit's version that added
#: it, which runs added before 2.1.0 lack).
RUN_FIELDS = ("candidate", "target_tokens", "steps", "batch_size", "dev_bleu", "precision", "cpu", "command",
              "source")


@dataclasses.dataclass
class Prediction:
    """What scripts/recipe.py expects of a candidate on this machine."""
    tokens_per_s: Optional[float]  # real target tokens/s measured here; None when not measured
    tokens: Optional[float]  # real target tokens it would train in the time left; None when not measured
    bleu: Optional[float]  # dev BLEU the table predicts at that budget; None: it can not be chosen
    basis: str  # how the prediction was made, or why there is none


def table_error(path, message):
    return UserError("%s: %s; fix the file (docs/recipe.md describes it)" % (path, message))


def check_candidate(candidate, train_flags, path):
    """Raises a UserError unless candidate is {"name": str, "flags": [str]} whose flags, with train_flags, are
    train.py flags with values in range, and whose "vocab_size", if it has one, is a whole number above 1."""
    if not isinstance(candidate, dict) or not isinstance(candidate.get("name"), str) or not isinstance(
            candidate.get("flags"), list) or not all(isinstance(flag, str) for flag in candidate["flags"]):
        raise table_error(path, "every candidate must be {\"name\": NAME, \"flags\": [train.py flags]}, not %s"
                          % json.dumps(candidate))
    vocab_size = candidate.get("vocab_size", DEFAULT_VOCAB_SIZE)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise table_error(path, "the vocab_size of candidate %s must be a whole number of BPE pieces (prepro.py "
                                "--vocab_size), not %s" % (candidate["name"], json.dumps(vocab_size)))
    parser = Hparams(prog="train.py").parser

    def reject(message):
        raise table_error(path, "the flags of candidate %s are not train.py's: %s" % (candidate["name"], message))

    parser.error = reject  # instead of exiting, name the candidate
    problem = range_error(parser.parse_args(candidate["flags"] + train_flags))
    if problem:
        reject(problem)


def check_run(run, names, path):
    """Raises a UserError unless run has every RUN_FIELDS, names a candidate and has a positive budget."""
    missing = [field for field in RUN_FIELDS if field not in run] if isinstance(run, dict) else list(RUN_FIELDS)
    if missing:
        raise table_error(path, "the run %s lacks %s" % (json.dumps(run), ", ".join(missing)))
    if run["candidate"] not in names:
        raise table_error(path, "a run names the candidate %s, which is not among the candidates (%s)"
                          % (run["candidate"], ", ".join(names)))
    if not (isinstance(run["target_tokens"], (int, float)) and run["target_tokens"] > 0
            and isinstance(run["dev_bleu"], (int, float))):
        raise table_error(path, "the run %s needs target_tokens above 0 and a number for dev_bleu"
                          % json.dumps(run))


def check_table(table, path):
    """Raises a UserError naming what is wrong with the table read from path."""
    if not isinstance(table, dict) or not all(isinstance(table.get(key), list)
                                              for key in ("train_flags", "candidates", "runs")):
        raise table_error(path, "it must be an object with the lists train_flags, candidates and runs")
    if not table["candidates"]:
        raise table_error(path, "it lists no candidates")
    for candidate in table["candidates"]:
        check_candidate(candidate, table["train_flags"], path)
    names = candidate_names(table)
    if len(set(names)) < len(names):
        raise table_error(path, "a candidate name appears twice (%s)" % ", ".join(names))
    for run in table["runs"]:
        check_run(run, names, path)


def load_table(path=TABLE_PATH):
    """The table in path, checked (check_table)."""
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except OSError as error:
        raise UserError("cannot read the recipe table %s: %s" % (path, error.strerror)) from None
    except ValueError as error:
        raise table_error(path, "not valid JSON (%s)" % str(error).splitlines()[0]) from None
    check_table(table, path)
    return table


def candidate_names(table):
    """The candidates' names, in the table's order."""
    return [candidate["name"] for candidate in table["candidates"]]


def train_flags(table, name):
    """The train.py flags of candidate `name`: its own, then those every candidate trains with."""
    return next(c["flags"] for c in table["candidates"] if c["name"] == name) + table["train_flags"]


def vocab_size(table, name):
    """The joint BPE vocabulary candidate `name` trains on: its "vocab_size", else DEFAULT_VOCAB_SIZE."""
    return next(c for c in table["candidates"] if c["name"] == name).get("vocab_size", DEFAULT_VOCAB_SIZE)


def runs_of(table, name):
    """The measured runs of candidate `name`."""
    return [run for run in table["runs"] if run["candidate"] == name]


def budget_points(runs):
    """[(target tokens, dev BLEU)] of runs, smallest budget first: runs within POOL_RATIO of the smallest budget
    not yet pooled become one point, their mean BLEU at the geometric mean of their budgets."""
    runs = sorted(runs, key=lambda run: run["target_tokens"])
    points, start = [], 0
    while start < len(runs):
        end = start + 1
        while end < len(runs) and runs[end]["target_tokens"] <= runs[start]["target_tokens"] * POOL_RATIO:
            end += 1
        group = runs[start:end]
        tokens = [run["target_tokens"] for run in group]
        mean_tokens = tokens[0] if len(group) == 1 else math.exp(sum(map(math.log, tokens)) / len(group))
        points.append((mean_tokens, sum(run["dev_bleu"] for run in group) / len(group)))
        start = end
    return points


def predict_bleu(points, tokens):
    """(dev BLEU or None, how) at a budget of `tokens` target tokens from budget points (budget_points)."""
    if not points:
        return None, "no measured runs"
    if tokens < points[0][0]:
        return None, "below its smallest measured budget (%.2f M tokens)" % (points[0][0] / 1e6)
    if tokens >= points[-1][0]:
        held = " (held)" if tokens > points[-1][0] else ""
        return points[-1][1], "at its largest measured budget, %.2f M tokens%s" % (points[-1][0] / 1e6, held)
    (low, low_bleu), (high, high_bleu) = next(
        (points[i], points[i + 1]) for i in range(len(points) - 1) if tokens < points[i + 1][0])
    share = (math.log(tokens) - math.log(low)) / (math.log(high) - math.log(low))
    return low_bleu + share * (high_bleu - low_bleu), "interpolated between %.2f M and %.2f M tokens" % (
        low / 1e6, high / 1e6)


def predict_at(table, name, tokens):
    """The Prediction for candidate `name` at a budget of `tokens` real target tokens (no speed in it)."""
    bleu, basis = predict_bleu(budget_points(runs_of(table, name)), tokens)
    return Prediction(None, tokens, bleu, basis)


def predict(table, name, tokens_per_s, seconds):
    """The Prediction for candidate `name` when it trains `seconds` at tokens_per_s."""
    return dataclasses.replace(predict_at(table, name, tokens_per_s * max(seconds, 0)), tokens_per_s=tokens_per_s)


def choose(predictions, names):
    """(the chosen name, why) among `names` (in the table's order) from predictions {name: Prediction}: the highest
    predicted BLEU, ties to the first listed; the first name when none has a prediction."""
    best = None
    for name in names:
        bleu = predictions[name].bleu
        if bleu is not None and (best is None or bleu > predictions[best].bleu):
            best = name
    if best is None:
        return names[0], "no candidate has a prediction for its budget: the first one listed"
    return best, "the highest predicted dev BLEU"


def format_table(table):
    """The table as JSON text with one line per candidate and per run (short diffs when a run is added)."""
    lines, items = ["{"], list(table.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            rows = ",\n".join("    " + json.dumps(item, ensure_ascii=False) for item in value)
            lines.append("  %s: [\n%s\n  ]%s" % (json.dumps(key), rows, comma))
        else:
            lines.append("  %s: %s%s" % (json.dumps(key), json.dumps(value, ensure_ascii=False), comma))
    return "\n".join(lines + ["}"]) + "\n"
