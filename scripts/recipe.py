"""The Multi30k German->English recipe under a wall-time budget, end to end (scripts/multi30k.sh runs it).

    python scripts/recipe.py --minutes 60 [--logdir runs/multi30k_60m] [--data_dir data/multi30k]
                             [--candidates NAME,NAME] [--table scripts/recipe_table.json] [--choose_only]
                             [--reverse]

With --reverse it trains English->German (prepro.py --reverse) into its own data dir and logdir; the choice of model
still reads the table's de->en runs.

The model is chosen from the candidates of scripts/recipe_table.json (train.py flags, and the dev BLEU each reached
after a measured number of real target tokens trained) by the training budget this machine can buy
(docs/recipe.md). Phases, each command printed before it runs:
  prepro   the joint BPE vocabulary and segmented corpus, from ../shared/data/multi30k when present, else
           downloaded: one data dir per vocabulary size among the candidates allowed (candidate_data_dir)
  kernels  the fused training kernels built for this CPU (python -m fast.kernels), or their failed build remembered,
           so that neither the measuring nor training pays a compile
  measure  real target tokens/s here: an epoch's mean tokens per batch over the median time of MEASURE_STEPS
           steady-state steps after MEASURE_WARMUP untimed ones, in one scripts/bench_train.py process (one graph
           per candidate, on its own data dir): the first candidate first; then each other one whose dev BLEU the
           table can predict at ESTIMATE_SLACK x the target tokens estimated for it from the first one's speed
           (training FLOPs per token, R-Drop's two passes counted), as no other could be chosen, the highest
           prediction at that estimate first (the likely choice is measured, not estimated). All of it within
           MEASURE_SHARE of the budget plus the first graph build. A candidate not measured by then (or whose
           measuring failed) has its speed estimated: from the first one's by training FLOPs per token, or when
           none was measured, from a 2048^2 matmul read here at MATMUL_SHARE of its FLOP/s. Skipped when the
           choice can not depend on it (choice_without_measuring)
  choose   for each, the target tokens it would train in the time left (tokens/s x seconds) and the dev BLEU the
           table predicts at that budget; the highest wins (scripts/recipe_table.py has the rule)
  train    the chosen flags on its data dir with --max_minutes = what is left of the budget minus
           POST_TRAIN_MINUTES; the learning rate decays to 0 when that time is up (train.py --lr_schedule linear,
           whose end follows the speed observed while training)
  test     test2016 with the last checkpoint, greedy and with beam BEAM_SIZE, length penalty LENGTH_PENALTY
           (averaging the last checkpoints or decoding them as an ensemble did not pay on dev once the learning rate
           decays to 0: docs/recipe.md)
Then it prints a results table (the choice, BLEU, steps, epochs, tokens/s, wall time per phase and the training
time planned, CPU, ISA flags, precision) and writes it, with the data dir trained on and what was measured and
predicted, as JSON to LOGDIR/recipe.json. With --choose_only it stops after the choice and writes nothing but the
data dirs.
"""
import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import Optional


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import recipe_table  # noqa: E402
from toolkit.base import runtime  # noqa: E402,F401  (first: TensorFlow's environment defaults)
from toolkit.base import machine
from toolkit.data.datadir import load_manifest, split_paths  # noqa: E402
from toolkit.base.errors import UserError  # noqa: E402
from toolkit.base.cli import run_cli
from toolkit.base.ids import OFFSETS_DTYPE, map_file  # noqa: E402
from hparams import Hparams  # noqa: E402
from model_flops import training_flops  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
BEAM_SIZE, LENGTH_PENALTY = 4, 1.2
#: Wall time kept for what follows training: the final dev decode and both test decodes.
POST_TRAIN_MINUTES = 2.5
#: bench_train.py per candidate: untimed steps, timed steady-state steps, and the most steps after the untimed ones
#: (the first step on each new batch shape builds kernels and is not timed).
MEASURE_WARMUP, MEASURE_STEPS, MEASURE_MAX_STEPS = 1, 3, 20
#: bench_train.py --batches: the timed steps run on the first MEASURE_BATCHES batches again, all seen in the first
#: pass (batches of three lengths, without waiting for shapes to repeat in the whole data).
MEASURE_BATCHES = 3
#: The share of the budget measuring may take in all, the first candidate's graph build not counted.
MEASURE_SHARE = 0.02
#: Another candidate than the first is measured only when the table can predict it at this many times the target
#: tokens estimated for it from the first one's speed: the estimate counts FLOPs only, and leaving out a candidate
#: the table could predict (and choose) costs more than measuring one it then can not.
ESTIMATE_SLACK = 1.25
#: A training step's model FLOP/s as a share of a 2048^2 fp32 matmul's here (bench_train.py's mfu: about 0.5 in
#: fp32 on TensorFlow's ops, more with the fused kernels or bf16), for a speed estimated with nothing measured.
MATMUL_SHARE = 0.5
#: Measuring stops this many seconds before its allowance is spent, to end within it: the time to kill the measuring
#: process (it has nothing to save, and a step in progress is not waited for) and collect it.
STOP_MARGIN_S = 1.0
#: What Bench.message returns when its deadline passes first.
TIMEOUT = object()
OUT_OF_TIME = "not measured: the measurement's share of the budget ran out"
EPOCH_LINE = re.compile(r"^epoch (\d+) \| step (\d+) \| loss [\d.]+ \| (\d+) tgt tok/s")


def run(command, log):
    """Runs a command (list) in ROOT, echoing it and its output; returns (stdout text, seconds).
    Exits with the command's code if it fails."""
    print("$ " + " ".join(command), flush=True)
    start = time.time()
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
            lines.append(line)
    if proc.returncode:
        sys.exit(proc.returncode)
    return "".join(lines), time.time() - start


def prepro_command(data_dir, vocab_size, reverse=False):
    """prepro.py with a joint BPE vocabulary of vocab_size pieces, from the Multi30k files beside the repository, or
    from the download; reverse: English->German."""
    command = [sys.executable, "prepro.py", "--vocab_size", str(vocab_size), "--data_dir", data_dir]
    command += ["--reverse"] if reverse else []
    if not os.path.isdir(SHARED):
        return command + ["--dataset", "multi30k"]
    files = dict(train="train", eval="dev", test="test")
    command += ["--dataset", "files"]
    for split, name in files.items():
        for side, lang in ((1, "de"), (2, "en")):
            command += ["--%s%d" % (split, side), os.path.join(SHARED, "%s.%s" % (name, lang))]
    return command


def vocab_data_dir(data_dir, vocab_size):
    """The data dir of a vocabulary of vocab_size pieces: data_dir itself for recipe_table.DEFAULT_VOCAB_SIZE's (as
    before candidates had vocabularies of their own), else data_dir with _v<vocab_size> appended."""
    if vocab_size == recipe_table.DEFAULT_VOCAB_SIZE:
        return data_dir
    return "%s_v%d" % (data_dir.rstrip("/"), vocab_size)


def candidate_data_dir(table, name, data_dir):
    """The data dir candidate `name` trains on (vocab_data_dir of its vocabulary) when the recipe's is data_dir."""
    return vocab_data_dir(data_dir, recipe_table.vocab_size(table, name))


def vocab_sizes(table, names):
    """The vocabulary sizes of candidates `names`, each once, in their order: one data dir each."""
    return list(dict.fromkeys(recipe_table.vocab_size(table, name) for name in names))


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def matmul_gflops():
    """A 2048x2048 fp32 matmul's speed here, in GFLOP/s (scripts/bench_train.py's reference), in a subprocess."""
    code = ("import sys; sys.path.insert(0, 'scripts'); import bench_train, hparams; "
            "from toolkit.base import machine; "
            "print(bench_train.matmul_gflops(machine.session_config(hparams.Hparams().parser.parse_args([]))))")
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(output.stdout.strip().splitlines()[-1])


@dataclasses.dataclass
class Speed:
    """A candidate's speed here: real target tokens/s (None: neither measured nor estimated) and what it is (or why
    there is none); result: bench_train.py's JSON; uncounted_s: seconds of the measurement not counted against its
    allowance (the first candidate's graph build); estimated: whether tokens_per_s is an estimate."""
    tokens_per_s: Optional[float]
    note: str
    result: Optional[dict] = None
    uncounted_s: float = 0.0
    estimated: bool = False


def bench_command(data_dir):
    """scripts/bench_train.py measuring, one after the other, the models whose flags come on its stdin."""
    return [sys.executable, "scripts/bench_train.py", "--data_dir", data_dir, "--warmup", str(MEASURE_WARMUP),
            "--steps", str(MEASURE_STEPS), "--max_steps", str(MEASURE_MAX_STEPS), "--batches", str(MEASURE_BATCHES),
            "--flags_from_stdin"]


class Bench:
    """One measuring process for every candidate (bench_command): TensorFlow imported once, no matmul read, each
    candidate's graph built in its own tf.Graph. Its output is read as it comes (a thread queues the lines,
    which go to the log), so a measurement is cut off when its time is up: the process is stopped then, and on
    leaving the `with` block."""

    def __init__(self, command, log):
        print("$ " + " ".join(command), flush=True)
        self.proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines, self.log, self.last_text, self.out_of_time, self.ended = queue.Queue(), log, "", False, False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def stop(self):
        """Ends the process at once: it is killed, as it has nothing to save."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def message(self, deadline):
        """The next JSON object the process prints (other lines go to the log), None when it has ended, or
        TIMEOUT when time.monotonic() passes deadline (None: no deadline) before it comes."""
        while not self.ended:
            try:
                line = self.lines.get(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
            except queue.Empty:
                return TIMEOUT
            if line is None:
                self.ended = True
                break
            self.log.write(line)
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    return message
            self.last_text = line.strip() or self.last_text
        return None

    def measure(self, flags, seconds, count_build):
        """The Speed of a candidate's train.py flags here, measured in at most `seconds`, its graph build included
        when count_build (else the time runs from when the build is reported, and the build is uncounted_s). Once
        one has run out of time, the process is stopped and no other is measured."""
        if self.out_of_time:
            return Speed(None, OUT_OF_TIME)
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(json.dumps(flags) + "\n")
            self.proc.stdin.flush()
        start, uncounted = time.monotonic(), 0.0
        deadline = start + seconds if count_build else None
        while True:
            message = self.message(deadline)
            if message is TIMEOUT:
                self.stop()
                self.out_of_time = True
                return Speed(None, OUT_OF_TIME, None, uncounted)
            if message is None:
                return Speed(None, "measurement failed: %s" % (self.last_text or "the process ended"), None, uncounted)
            if "error" in message:
                return Speed(None, "measurement failed: %s" % message["error"], None, uncounted)
            if "epoch_tgt_tokens_per_s" in message:
                return Speed(message["epoch_tgt_tokens_per_s"], "an epoch's mean batch over the median of %d "
                             "steady-state steps" % message["timed_steps"], message, uncounted)
            if not count_build and "graph_build_s" in message:
                uncounted = message["graph_build_s"]
                deadline = start + seconds + uncounted


def measured_flags(table, name, data_dir):
    """The flags bench_command's process measures candidate `name` with: its train.py flags and its own data dir
    (candidate_data_dir), which a line of that process takes over its command line's."""
    return recipe_table.train_flags(table, name) + ["--data_dir", candidate_data_dir(table, name, data_dir)]


def training_flops_per_token(table, name, lengths):
    """Candidate `name`'s model FLOPs of training per real target token, on sentence pairs of lengths =
    (vocab_size, real source tokens, real target tokens) (model_flops.training_flops: R-Drop's two passes
    included)."""
    vocab_size, src, tgt = lengths
    hp = Hparams().parser.parse_args(recipe_table.train_flags(table, name))
    hp.vocab_size = vocab_size
    return training_flops(hp, 1, src, tgt, tgt) / tgt


def measured_lengths(result):
    """(vocab_size, real source and target tokens per sentence) of the batches bench_train.py measured."""
    return (result["vocab_size"], result["real_src_tokens_per_sentence"],
            result["real_tgt_tokens_per_sentence"])


def corpus_lengths(data_dir):
    """(vocab_size, real source and target tokens per sentence, </s> included) of data_dir's training split."""
    manifest = load_manifest(data_dir)
    paths = split_paths(data_dir, manifest, "train")
    per_side = []
    for side in (1, 2):
        offsets = map_file(paths["offsets%d" % side], OFFSETS_DTYPE)
        per_side.append(float(offsets[-1]) / max(len(offsets) - 1, 1) + 1)
    return (manifest["vocab_size"], *per_side)


def candidate_lengths(table, name, reference_name, measured, corpus_of):
    """The lengths (as measured_lengths) of candidate `name`'s sentences where the reference candidate's measured
    ones were `measured`: those, when both share a vocabulary; else those in its own vocabulary, each side scaled by
    the ratio of the two training splits' mean lengths (corpus_of(vocabulary size): corpus_lengths of its data
    dir)."""
    vocab_size = recipe_table.vocab_size(table, name)
    if vocab_size == recipe_table.vocab_size(table, reference_name):
        return measured
    own, reference = corpus_of(vocab_size), corpus_of(recipe_table.vocab_size(table, reference_name))
    return (own[0], measured[1] * own[1] / reference[1], measured[2] * own[2] / reference[2])


def estimated_speed(table, name, reference_name, reference, corpus_of=None):
    """An estimate of candidate `name`'s real target tokens/s here from the reference candidate's measured Speed:
    that speed times the ratio of their training FLOPs per real target token (on sentences of the lengths measured,
    in each one's vocabulary: candidate_lengths, which needs corpus_of only when their vocabularies differ). FLOPs
    only: how the batch size, dropout and each shape's fit to the CPU change the speed is left out, so it is rough
    (ESTIMATE_SLACK)."""
    measured = measured_lengths(reference.result)
    lengths = candidate_lengths(table, name, reference_name, measured, corpus_of)
    return (reference.tokens_per_s * training_flops_per_token(table, reference_name, measured)
            / training_flops_per_token(table, name, lengths))


def matmul_speed(table, name, lengths, gflops):
    """An estimate of candidate `name`'s real target tokens/s with nothing measured: its training FLOPs per token
    (training_flops_per_token) at MATMUL_SHARE of a matmul's gflops, on sentences of `lengths` (corpus_lengths of
    its data dir)."""
    return MATMUL_SHARE * gflops * 1e9 / training_flops_per_token(table, name, lengths)


def choice_without_measuring(table, names):
    """The candidate among names (in the table's order) that is chosen whatever the speeds, or None: the only
    one; or the first, when no other has measured runs (a candidate without a prediction is never chosen, and the
    first is the choice when none has one)."""
    with_runs = [name for name in names if recipe_table.runs_of(table, name)]
    return names[0] if len(names) == 1 or with_runs in ([], names[:1]) else None


def measure_speeds(table, names, allowance, measure, estimate_tokens, clock=time.monotonic, data_dir=None):
    """{name: Speed} of candidates `names` (the table's order), measured with measure(train.py flags, seconds it
    may take, whether its graph build counts) while the allowance (seconds) lasts; with data_dir (the recipe's),
    each candidate's flags name its own data dir (measured_flags).

    The first is measured first, its graph build not counted: its Speed is the reference of estimate_tokens(name,
    first's Speed), the target tokens another candidate would train here (None: no estimate). The others follow
    most_promising_first. Another candidate is measured only when the table can predict its dev BLEU at
    ESTIMATE_SLACK times that estimate: else measuring it could not change the choice. Candidates without measured
    runs are never measured but the first. Those that could have been measured but were not (out of time, or a
    failed measurement) are estimated (estimate_unmeasured).
    """
    def flags(name):
        return measured_flags(table, name, data_dir) if data_dir else recipe_table.train_flags(table, name)
    start = clock()
    first = measure(flags(names[0]), allowance, False)
    speeds, allowance = {names[0]: first}, allowance + first.uncounted_s
    estimates = {name: estimate_tokens(name, first) for name in names[1:]}
    for name in most_promising_first(table, names[1:], estimates):
        runs, estimate = recipe_table.runs_of(table, name), estimates[name]
        if not runs:
            speeds[name] = Speed(None, "not measured: no measured runs in the table")
        elif estimate is not None and recipe_table.predict_at(table, name, ESTIMATE_SLACK * estimate).bleu is None:
            speeds[name] = Speed(None, "not measured: the table has no prediction below %.2f M tokens (about %.2f M "
                                       "estimated here)" % (recipe_table.budget_points(runs)[0][0] / 1e6,
                                                            estimate / 1e6))
        elif allowance - (clock() - start) <= 0:
            speeds[name] = Speed(None, OUT_OF_TIME)
        else:
            speeds[name] = measure(flags(name), allowance - (clock() - start), True)
    return speeds


def most_promising_first(table, names, estimates):
    """names in the order to measure them while the allowance lasts: by the dev BLEU the table predicts for
    each at its estimated target tokens (estimates {name: tokens or None}), highest first, so that the likely
    choice is measured rather than estimated; those without a prediction after them, in the table's order."""
    def rank(name):  # a sort key: the negated predicted BLEU
        bleu = None if estimates[name] is None else recipe_table.predict_at(table, name, estimates[name]).bleu
        return math.inf if bleu is None else -bleu
    return sorted(names, key=rank)


def estimate_unmeasured(speeds, names, estimate_speed):
    """speeds with each candidate that has runs in the table but no speed (its measuring ran out of time or failed)
    given estimate_speed(name, the first candidate's Speed): (tokens/s, how it was estimated)."""
    estimated = dict(speeds)
    for name in names:
        speed = speeds[name]
        if speed.tokens_per_s is None and (speed.note == OUT_OF_TIME or speed.note.startswith("measurement failed")):
            tokens_per_s, how = estimate_speed(name, speeds[names[0]])
            estimated[name] = Speed(tokens_per_s, "%s (%s)" % (how, speed.note), speed.result, speed.uncounted_s,
                                    estimated=True)
    return estimated


def predictions(table, speeds, seconds):
    """{name: recipe_table.Prediction} of the candidates of speeds (measure_speeds) for `seconds` of training; the
    basis of one whose speed is estimated starts with how."""
    predicted = {}
    for name, speed in speeds.items():
        if speed.tokens_per_s is None:
            predicted[name] = recipe_table.Prediction(None, None, None, speed.note)
            continue
        predicted[name] = recipe_table.predict(table, name, speed.tokens_per_s, seconds)
        if speed.estimated:
            predicted[name].basis = "speed %s; %s" % (speed.note, predicted[name].basis)
    return predicted


def choice_lines(predicted, chosen, reason):
    """What was measured, predicted and chosen, as aligned text lines."""
    rows = [("candidate", "tokens/s here", "predicted tokens", "predicted dev BLEU", "how")]
    for name, p in predicted.items():
        rows.append((name, "-" if p.tokens_per_s is None else "%.0f" % p.tokens_per_s,
                     "-" if p.tokens is None else "%.2f M" % (p.tokens / 1e6),
                     "-" if p.bleu is None else "%.2f" % p.bleu, p.basis))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["%-*s  %*s  %*s  %*s  %s" % (widths[0], row[0], widths[1], row[1], widths[2], row[2], widths[3],
                                          row[3], row[4]) for row in rows]
    return lines + ["chose %s: %s" % (chosen, reason)]


def choice_record(predicted, chosen, reason, flags, measuring):
    """The choice as recipe.json keeps it; measuring: its seconds (measuring_record), None when skipped."""
    return {"chosen": chosen, "reason": reason, "flags": flags, "measuring": measuring,
            "candidates": {name: {"tokens_per_s": p.tokens_per_s, "predicted_tokens": p.tokens,
                                  "predicted_dev_bleu": p.bleu, "how": p.basis} for name, p in predicted.items()}}


def results_lines(results):
    """The results as aligned text lines."""
    rows = [("chosen", "%s (%s)" % (results["choice"]["chosen"], results["choice"]["reason"])),
            ("test2016 BLEU, greedy", "%.2f" % results["bleu_greedy"]),
            ("test2016 BLEU, beam %d, alpha %g" % (BEAM_SIZE, LENGTH_PENALTY), "%.2f" % results["bleu_beam"]),
            ("steps, epochs", "%d, %.1f" % (results["steps"], results["epochs"])),
            ("target tokens/s (mean of epochs)", "%.0f" % results["tgt_tokens_per_s"]),
            ("precision", results["precision"]),
            ("CPU", "%s (%s), %d cores, 2048^2 matmul %.0f GFLOP/s" % (
                results["machine"]["cpu"], " ".join(results["machine"]["isa_flags"]), results["machine"]["cores"],
                results["matmul_gflops_per_s"]))]
    if results["machine"]["onednn_max_cpu_isa"]:
        rows.append(("ONEDNN_MAX_CPU_ISA", results["machine"]["onednn_max_cpu_isa"]))
    planned = {"train": " of %.0f s planned" % results["train_planned_s"]}  # train.py's --max_minutes
    rows += [("wall, %s" % phase, "%.0f s%s" % (seconds, planned.get(phase, "")))
             for phase, seconds in results["seconds"].items()]
    width = max(len(name) for name, _ in rows)
    return ["%-*s  %s" % (width, name, value) for name, value in rows]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Here MEASURE_WARMUP = %d, MEASURE_STEPS = %d (of at most %d after the warm-up), MEASURE_SHARE = %g, "
               "ESTIMATE_SLACK = %g, POST_TRAIN_MINUTES = %g." % (MEASURE_WARMUP, MEASURE_STEPS, MEASURE_MAX_STEPS,
                                                                  MEASURE_SHARE, ESTIMATE_SLACK, POST_TRAIN_MINUTES))
    parser.add_argument("--minutes", type=float, default=60, help="wall-time budget of the whole recipe")
    parser.add_argument("--data_dir", help="data dir (reused when it exists; default data/multi30k, with "
                                           "--reverse data/multi30k_en_de)")
    parser.add_argument("--logdir", help="where the model goes; must not exist yet (default runs/multi30k_MINUTESm, "
                                         "with --reverse runs/multi30k_en_de_MINUTESm)")
    parser.add_argument("--reverse", action="store_true",
                        help="train the other direction, English->German: prepro.py --reverse")
    parser.add_argument("--candidates", help="comma-separated names of the table's candidates to choose from "
                                             "(default: all); one name trains it without measuring anything")
    parser.add_argument("--table", default=recipe_table.TABLE_PATH,
                        help="the candidates and their measured runs (docs/recipe.md describes the file)")
    parser.add_argument("--choose_only", action="store_true",
                        help="prepare the data, measure and choose for --minutes, print the choice and stop: "
                             "what would it train here? Nothing is trained and no logdir is written")
    args = parser.parse_args(argv)
    name = "multi30k_en_de" if args.reverse else "multi30k"
    args.data_dir = args.data_dir or "data/" + name
    args.logdir = args.logdir or "runs/%s_%gm" % (name, args.minutes)
    args.direction = "en->de" if args.reverse else "de->en"
    return args


def allowed_candidates(table, given):
    """The candidates named in `given` (comma-separated; None: every one) in the table's order."""
    names = recipe_table.candidate_names(table)
    if given is None:
        return names
    wanted = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in names]
    if unknown or not wanted:
        raise UserError("--candidates %s: %s; the table's candidates are %s" % (
            given, "no such candidate %s" % ", ".join(unknown) if unknown else "no name given", ", ".join(names)))
    return [name for name in names if name in wanted]


def say(lines, log):
    """Prints lines and writes them to the recipe's log."""
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    log.write(text)


def train_seconds_left(minutes, start):
    """The seconds of training left of a budget of `minutes` begun at time.time() `start`."""
    return (minutes - POST_TRAIN_MINUTES) * 60 - (time.time() - start)


def measuring_record(seconds, allowance, speeds):
    """How long measuring took against what it may take, as recipe.json keeps it."""
    uncounted = sum(speed.uncounted_s for speed in speeds.values())
    return {"seconds": round(seconds, 1), "allowance_s": round(allowance, 1), "uncounted_s": round(uncounted, 1)}


def measure_here(table, names, args, start, log):
    """measure_speeds with the measuring process (Bench), estimates from the first candidate's speed and the
    training time left, then estimate_unmeasured. Returns the speeds and measuring_record."""
    allowance, measure_start = MEASURE_SHARE * args.minutes * 60, time.time()
    corpus_of = functools.lru_cache(maxsize=None)(lambda vocab_size: corpus_lengths(
        vocab_data_dir(args.data_dir, vocab_size)))

    def estimate_tokens(name, first):
        if first.tokens_per_s is None:
            return None
        return estimated_speed(table, name, names[0], first, corpus_of) * train_seconds_left(args.minutes, start)

    matmul = functools.lru_cache(maxsize=1)(matmul_gflops)  # read once, and only when nothing was measured

    def estimate_speed(name, first):
        if first.tokens_per_s is not None:
            return (estimated_speed(table, name, names[0], first, corpus_of),
                    "estimated from %s's measured speed by model FLOPs per token" % names[0])
        gflops = matmul()
        return (matmul_speed(table, name, corpus_of(recipe_table.vocab_size(table, name)), gflops),
                "estimated as %g of a %.0f GFLOP/s matmul read here" % (MATMUL_SHARE, gflops))
    with Bench(bench_command(candidate_data_dir(table, names[0], args.data_dir)), log) as bench:
        speeds = measure_speeds(table, names, allowance - STOP_MARGIN_S, bench.measure, estimate_tokens,
                                data_dir=args.data_dir)
    record = measuring_record(time.time() - measure_start, allowance, speeds)
    return estimate_unmeasured(speeds, names, estimate_speed), record


def choose_model(table, names, args, start, log):
    """Measures the candidates here, predicts and chooses (printing each), unless the choice can not depend on it.
    Returns the choice (as recipe.json keeps it) and the minutes left for training."""
    chosen, predicted, measuring = choice_without_measuring(table, names), {}, None
    if chosen:
        reason = ("the only candidate allowed" if len(names) == 1 else
                  "no other candidate has measured runs, so measuring could not change the choice")
        say(["measure: skipped; chose %s: %s" % (chosen, reason)], log)
    else:
        speeds, measuring = measure_here(table, names, args, start, log)
        say(["measure: %.1f s (%.1f s allowed, %g%% of the budget, and %.1f s of the first candidate's graph build "
             "not counted)" % (measuring["seconds"], measuring["allowance_s"], 100 * MEASURE_SHARE,
                               measuring["uncounted_s"])], log)
    train_seconds = train_seconds_left(args.minutes, start)
    if train_seconds <= 0:
        raise UserError("--minutes %g: no time is left to train after preparing the data and measuring" %
                        args.minutes)
    if not chosen:
        predicted = predictions(table, speeds, train_seconds)
        chosen, reason = recipe_table.choose(predicted, names)
        say(["", "for %.1f minutes of training:" % (train_seconds / 60)] + choice_lines(predicted, chosen, reason)
            + [""], log)
    flags = recipe_table.train_flags(table, chosen)
    return choice_record(predicted, chosen, reason, flags, measuring), train_seconds / 60


def prepare_and_choose(table, names, args, start, log, seconds):
    """prepro (a data dir per vocabulary size of the candidates `names`) and the kernels' build, then choose_model,
    for a budget begun at `start`; each phase's wall time goes to seconds. Returns choose_model's."""
    seconds["prepro"] = sum(run(prepro_command(vocab_data_dir(args.data_dir, vocab_size), vocab_size,
                                               args.reverse), log)[1] for vocab_size in vocab_sizes(table, names))
    _, seconds["kernels"] = run([sys.executable, "-m", "fast.kernels"], log)
    measure_start = time.time()
    chosen = choose_model(table, names, args, start, log)
    seconds["measure and choose"] = time.time() - measure_start
    return chosen


def decode_test2016(logdir, log, seconds):
    """test2016 BLEU of the last checkpoint, {"greedy": .., "beam": ..}; each decode's wall time goes to seconds."""
    bleu = {}
    for name, beam in (("greedy", 1), ("beam", BEAM_SIZE)):
        testdir = os.path.join(logdir, "test_" + name)
        _, seconds["test " + name] = run([sys.executable, "test.py", "--logdir", logdir, "--beam_size", str(beam),
                                          "--alpha", str(LENGTH_PENALTY), "--testdir", testdir], log)
        bleu[name] = read_json(os.path.join(ROOT, testdir, "results.json"))["bleu"]
    return bleu


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    table = recipe_table.load_table(args.table)
    names = allowed_candidates(table, args.candidates)
    logdir = args.logdir
    if os.path.exists(os.path.join(ROOT, logdir)) and not args.choose_only:
        raise UserError("%s exists: the recipe trains from scratch; remove it or pass another --logdir" % logdir)
    if args.minutes <= POST_TRAIN_MINUTES + 1:
        raise UserError("--minutes %g leaves no time to train: give more than %g" % (args.minutes,
                                                                                   POST_TRAIN_MINUTES + 1))
    start, seconds = time.time(), {}
    if args.choose_only:
        with open(os.devnull, "w", encoding="utf-8") as log:
            prepare_and_choose(table, names, args, start, log, seconds)
        return 0
    os.makedirs(os.path.join(ROOT, logdir))
    with open(os.path.join(ROOT, logdir, "recipe.log"), "w", encoding="utf-8") as log:
        choice, train_minutes = prepare_and_choose(table, names, args, start, log, seconds)
        data_dir, max_minutes = candidate_data_dir(table, choice["chosen"], args.data_dir), "%.2f" % train_minutes
        train_output, seconds["train"] = run(
            [sys.executable, "train.py", "--data_dir", data_dir, "--logdir", logdir] + choice["flags"]
            + ["--max_minutes", max_minutes], log)
        epochs = [tuple(map(int, m.groups())) for m in map(EPOCH_LINE.match, train_output.splitlines()) if m]
        bleu = decode_test2016(logdir, log, seconds)
    seconds["total"] = time.time() - start
    hparams = read_json(os.path.join(ROOT, logdir, "hparams.json"))
    steps_per_epoch = epochs[0][1] if epochs else 1
    results = {
        "minutes": args.minutes, "command": "python scripts/recipe.py " + shlex.join(argv), "choice": choice,
        "bleu_greedy": bleu["greedy"], "bleu_beam": bleu["beam"],
        "steps": epochs[-1][1], "epochs": epochs[-1][1] / steps_per_epoch,
        "tgt_tokens_per_s": sum(e[2] for e in epochs) / len(epochs), "precision": hparams["precision"],
        "machine": machine.machine_summary(), "matmul_gflops_per_s": matmul_gflops(),
        "seconds": {phase: round(s, 1) for phase, s in seconds.items()},
        "train_planned_s": round(float(max_minutes) * 60, 1), "recipe": choice["flags"], "data_dir": data_dir,
        "vocab_size": recipe_table.vocab_size(table, choice["chosen"]),
        "beam_size": BEAM_SIZE, "alpha": LENGTH_PENALTY, "logdir": logdir, "direction": args.direction,
    }
    with open(os.path.join(ROOT, logdir, "recipe.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print("\n".join(["", "Multi30k %s in %g minutes (%s/recipe.json)" % (args.direction, args.minutes, logdir)]
                    + results_lines(results)))
    return 0


if __name__ == "__main__":
    run_cli(main)
