"""The Multi30k German->English recipe under a wall-time budget, end to end (scripts/multi30k.sh runs it).

    python scripts/recipe.py --minutes 60 [--logdir runs/multi30k_60m] [--data_dir data/multi30k]
                             [--candidates NAME,NAME] [--table scripts/recipe_table.json]

The model is chosen from the candidates of scripts/recipe_table.json (train.py flags, and the dev BLEU each reached
after a measured number of real target tokens trained) by the training budget this machine can buy
(docs/recipe.md). Phases, each command printed before it runs:
  prepro   the joint BPE vocabulary and segmented corpus, from ../shared/data/multi30k when present, else downloaded
  measure  each candidate that can be chosen (one with measured runs): its real target tokens/s here, the median of
           MEASURE_STEPS steady-state steps of scripts/bench_train.py after MEASURE_WARMUP untimed ones; all of it
           within MEASURE_SHARE of the budget (a candidate not measured by then can not be chosen). Skipped when
           the choice can not depend on it (choice_without_measuring)
  choose   for each, the target tokens it would train in the time left (tokens/s x seconds) and the dev BLEU the
           table predicts at that budget; the highest wins (scripts/recipe_table.py has the rule)
  train    the chosen flags with --max_minutes = what is left of the budget minus POST_TRAIN_MINUTES; the learning
           rate decays to 0 exactly when that time is up (train.py --lr_schedule linear)
  test     test2016 with the last checkpoint, greedy and with beam BEAM_SIZE, length penalty LENGTH_PENALTY
           (averaging the last checkpoints did not pay on dev once the learning rate decays to 0: docs/recipe.md)
Then it prints a results table (the choice, BLEU, steps, epochs, tokens/s, wall time per phase, CPU, ISA flags,
precision) and writes it, with what was measured and predicted, as JSON to LOGDIR/recipe.json.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import recipe_table  # noqa: E402
import runtime  # noqa: E402
from errors import UserError, run_cli  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
BEAM_SIZE, LENGTH_PENALTY = 4, 1.2
#: Wall time kept for what follows training: the final dev decode and both test decodes.
POST_TRAIN_MINUTES = 2.5
#: bench_train.py per candidate: untimed steps, timed steady-state steps, and the most steps after the untimed ones
#: (the first step on each new batch shape builds kernels and is not timed).
MEASURE_WARMUP, MEASURE_STEPS, MEASURE_MAX_STEPS = 3, 5, 20
#: The share of the budget the measurement may take in all.
MEASURE_SHARE = 0.1
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


def prepro_command(data_dir):
    """prepro.py from the Multi30k files beside the repository, or from the download."""
    command = [sys.executable, "prepro.py", "--vocab_size", "8000", "--data_dir", data_dir]
    if not os.path.isdir(SHARED):
        return command + ["--dataset", "multi30k"]
    files = dict(train="train", eval="dev", test="test")
    command += ["--dataset", "files"]
    for split, name in files.items():
        for side, lang in ((1, "de"), (2, "en")):
            command += ["--%s%d" % (split, side), os.path.join(SHARED, "%s.%s" % (name, lang))]
    return command


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def matmul_gflops():
    """A 2048x2048 fp32 matmul's speed here, in GFLOP/s (scripts/bench_train.py's reference), in a subprocess."""
    code = ("import sys; sys.path.insert(0, 'scripts'); import bench_train, runtime, hparams; "
            "print(bench_train.matmul_gflops(runtime.session_config(hparams.Hparams().parser.parse_args([]))))")
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(output.stdout.strip().splitlines()[-1])


def bench_result(stdout):
    """The JSON object on the last line of bench_train.py's output; a ValueError when there is none."""
    lines = stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else None
    if not isinstance(result, dict) or "real_tgt_tokens_per_s" not in result:
        raise ValueError("its last line is not its JSON result")
    return result


def bench_speed(flags, data_dir, timeout, log):
    """(real target tokens/s, what it is) of a candidate's train.py flags here, from scripts/bench_train.py run for
    at most timeout seconds; (None, why not) when it ran out of time or failed."""
    command = [sys.executable, "scripts/bench_train.py", "--data_dir", data_dir, "--warmup", str(MEASURE_WARMUP),
               "--steps", str(MEASURE_STEPS), "--max_steps", str(MEASURE_MAX_STEPS)] + flags
    print("$ " + " ".join(command), flush=True)
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "not measured: the measurement's share of the budget ran out during it"
    log.write(proc.stderr + proc.stdout)
    try:
        if proc.returncode:
            raise ValueError((proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[-1])
        result = bench_result(proc.stdout)
    except ValueError as error:
        return None, "measurement failed: %s" % error
    return result["real_tgt_tokens_per_s"], "median of %d steady-state steps" % result["timed_steps"]


def choice_without_measuring(table, names):
    """The candidate among names (in the table's order) that is chosen whatever the speeds, or None: the only
    one; or the first, when no other has measured runs (a candidate without a prediction is never chosen, and the
    first is the choice when none has one)."""
    with_runs = [name for name in names if recipe_table.runs_of(table, name)]
    return names[0] if len(names) == 1 or with_runs in ([], names[:1]) else None


def measure_speeds(table, names, allowance, measure, clock=time.time):
    """{name: (real target tokens/s or None, what it is)} for candidates `names`, measured one after the other
    with measure(train.py flags, seconds it may take) while the allowance (seconds) lasts. Candidates without
    measured runs are not measured: they can not be chosen."""
    speeds, start = {}, clock()
    for name in names:
        left = allowance - (clock() - start)
        if not recipe_table.runs_of(table, name):
            speeds[name] = None, "not measured: no measured runs in the table"
        elif left <= 0:
            speeds[name] = None, "not measured: the measurement's share of the budget ran out"
        else:
            speeds[name] = measure(recipe_table.train_flags(table, name), left)
    return speeds


def predictions(table, speeds, seconds):
    """{name: recipe_table.Prediction} of the candidates of speeds (measure_speeds) for `seconds` of training."""
    return {name: recipe_table.predict(table, name, tokens_per_s, seconds) if tokens_per_s is not None
            else recipe_table.Prediction(None, None, None, note) for name, (tokens_per_s, note) in speeds.items()}


def choice_lines(predicted, chosen, reason):
    """What was measured, predicted and chosen, as aligned text lines."""
    rows = [("candidate", "measured tokens/s", "predicted tokens", "predicted dev BLEU", "how")]
    for name, p in predicted.items():
        rows.append((name, "-" if p.tokens_per_s is None else "%.0f" % p.tokens_per_s,
                     "-" if p.tokens is None else "%.2f M" % (p.tokens / 1e6),
                     "-" if p.bleu is None else "%.2f" % p.bleu, p.basis))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["%-*s  %*s  %*s  %*s  %s" % (widths[0], row[0], widths[1], row[1], widths[2], row[2], widths[3],
                                          row[3], row[4]) for row in rows]
    return lines + ["chose %s: %s" % (chosen, reason)]


def choice_record(predicted, chosen, reason, flags):
    """The choice as recipe.json keeps it."""
    return {"chosen": chosen, "reason": reason, "flags": flags,
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
    rows += [("wall, %s" % phase, "%.0f s" % seconds) for phase, seconds in results["seconds"].items()]
    width = max(len(name) for name, _ in rows)
    return ["%-*s  %s" % (width, name, value) for name, value in rows]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Here MEASURE_WARMUP = %d, MEASURE_STEPS = %d (of at most %d after the warm-up), MEASURE_SHARE = %g, "
               "POST_TRAIN_MINUTES = %g." % (MEASURE_WARMUP, MEASURE_STEPS, MEASURE_MAX_STEPS, MEASURE_SHARE,
                                             POST_TRAIN_MINUTES))
    parser.add_argument("--minutes", type=float, default=60, help="wall-time budget of the whole recipe")
    parser.add_argument("--data_dir", default="data/multi30k", help="data dir (reused when it exists)")
    parser.add_argument("--logdir", help="where the model goes; must not exist yet (default runs/multi30k_MINUTESm)")
    parser.add_argument("--candidates", help="comma-separated names of the table's candidates to choose from "
                                             "(default: all); one name trains it without measuring anything")
    parser.add_argument("--table", default=recipe_table.TABLE_PATH,
                        help="the candidates and their measured runs (docs/recipe.md describes the file)")
    return parser.parse_args(argv)


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


def choose_model(table, names, args, start, log):
    """Measures the candidates here, predicts and chooses (printing each), unless the choice can not depend on it.
    Returns the choice (as recipe.json keeps it) and the minutes left for training."""
    chosen = choice_without_measuring(table, names)
    if chosen:
        reason = ("the only candidate allowed" if len(names) == 1 else
                  "no other candidate has measured runs, so measuring could not change the choice")
        say(["measure: skipped; chose %s: %s" % (chosen, reason)], log)
    else:
        speeds = measure_speeds(table, names, MEASURE_SHARE * args.minutes * 60,
                                lambda flags, timeout: bench_speed(flags, args.data_dir, timeout, log))
    train_seconds = (args.minutes - POST_TRAIN_MINUTES) * 60 - (time.time() - start)
    if train_seconds <= 0:
        raise UserError("--minutes %g: no time is left to train after preparing the data and measuring" %
                        args.minutes)
    predicted = {}
    if not chosen:
        predicted = predictions(table, speeds, train_seconds)
        chosen, reason = recipe_table.choose(predicted, names)
        say(["", "for %.1f minutes of training:" % (train_seconds / 60)] + choice_lines(predicted, chosen, reason)
            + [""], log)
    return choice_record(predicted, chosen, reason, recipe_table.train_flags(table, chosen)), train_seconds / 60


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
    logdir = args.logdir or "runs/multi30k_%gm" % args.minutes
    if os.path.exists(os.path.join(ROOT, logdir)):
        raise UserError("%s exists: the recipe trains from scratch; remove it or pass another --logdir" % logdir)
    if args.minutes <= POST_TRAIN_MINUTES + 1:
        raise UserError("--minutes %g leaves no time to train: give more than %g" % (args.minutes,
                                                                                   POST_TRAIN_MINUTES + 1))
    start, seconds = time.time(), {}
    os.makedirs(os.path.join(ROOT, logdir))
    with open(os.path.join(ROOT, logdir, "recipe.log"), "w", encoding="utf-8") as log:
        _, seconds["prepro"] = run(prepro_command(args.data_dir), log)
        measure_start = time.time()
        choice, train_minutes = choose_model(table, names, args, start, log)
        seconds["measure and choose"] = time.time() - measure_start
        train_output, seconds["train"] = run(
            [sys.executable, "train.py", "--data_dir", args.data_dir, "--logdir", logdir] + choice["flags"]
            + ["--max_minutes", "%.2f" % train_minutes], log)
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
        "machine": runtime.machine_summary(), "matmul_gflops_per_s": matmul_gflops(),
        "seconds": {phase: round(s, 1) for phase, s in seconds.items()}, "recipe": choice["flags"],
        "beam_size": BEAM_SIZE, "alpha": LENGTH_PENALTY, "logdir": logdir,
    }
    with open(os.path.join(ROOT, logdir, "recipe.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print("\n".join(["", "Multi30k de->en in %g minutes (%s/recipe.json)" % (args.minutes, logdir)]
                    + results_lines(results)))
    return 0


if __name__ == "__main__":
    run_cli(main)
