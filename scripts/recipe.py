"""The Multi30k German->English recipe under a wall-time budget, end to end (scripts/multi30k.sh runs it).

    python scripts/recipe.py --minutes 60 [--logdir runs/multi30k_60m] [--data_dir data/multi30k]

Phases, each the command a user would type (printed before it runs):
  prepro   the joint BPE vocabulary and segmented corpus, from ../shared/data/multi30k when present, else downloaded
  train    RECIPE flags with --max_minutes = what is left of the budget minus POST_TRAIN_MINUTES; the learning rate
           decays to 0 exactly when that time is up (train.py --lr_schedule linear)
  test     test2016 with the last checkpoint, greedy and with beam BEAM_SIZE, length penalty LENGTH_PENALTY
           (averaging the last checkpoints did not pay on dev once the learning rate decays to 0: docs/recipe.md)
Then it prints a results table (BLEU, steps, epochs, tokens/s, wall time per phase, CPU, ISA flags, precision) and
writes it as JSON to LOGDIR/recipe.json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import runtime  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
#: The model and its training, chosen on dev (docs/recipe.md).
RECIPE = ["--d_model", "256", "--d_ff", "512", "--num_blocks", "3", "--num_heads", "8", "--dropout_rate", "0.1",
          "--batch_size", "2048", "--lr", "1e-3", "--warmup_steps", "800", "--lr_schedule", "linear",
          "--num_epochs", "1000", "--eval_every", "0", "--keep_checkpoints", "10"]
BEAM_SIZE, LENGTH_PENALTY = 4, 1.0
#: Wall time kept for what follows training: the final dev decode and both test decodes.
POST_TRAIN_MINUTES = 2.5
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
    code = ("import sys; sys.path.insert(0, 'scripts'); import bench_train, utils, hparams; "
            "print(bench_train.matmul_gflops(utils.session_config(hparams.Hparams().parser.parse_args([]))))")
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(output.stdout.strip().splitlines()[-1])


def table(results):
    """The results as aligned text lines."""
    rows = [("test2016 BLEU, greedy", "%.2f" % results["bleu_greedy"]),
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60, help="wall-time budget of the whole recipe")
    parser.add_argument("--data_dir", default="data/multi30k", help="data dir (reused when it exists)")
    parser.add_argument("--logdir", help="where the model goes; must not exist yet (default runs/multi30k_MINUTESm)")
    args = parser.parse_args(argv)
    logdir = args.logdir or "runs/multi30k_%gm" % args.minutes
    if os.path.exists(os.path.join(ROOT, logdir)):
        sys.exit("error: %s exists: the recipe trains from scratch; remove it or pass another --logdir" % logdir)
    if args.minutes <= POST_TRAIN_MINUTES + 1:
        sys.exit("error: --minutes %g leaves no time to train: give more than %g" % (args.minutes,
                                                                                       POST_TRAIN_MINUTES + 1))
    start, seconds = time.time(), {}
    os.makedirs(os.path.join(ROOT, logdir))
    with open(os.path.join(ROOT, logdir, "recipe.log"), "w", encoding="utf-8") as log:
        _, seconds["prepro"] = run(prepro_command(args.data_dir), log)
        train_minutes = args.minutes - POST_TRAIN_MINUTES - (time.time() - start) / 60
        train_output, seconds["train"] = run(
            [sys.executable, "train.py", "--data_dir", args.data_dir, "--logdir", logdir] + RECIPE
            + ["--max_minutes", "%.2f" % train_minutes], log)
        epochs = [tuple(map(int, m.groups())) for m in map(EPOCH_LINE.match, train_output.splitlines()) if m]
        bleu = {}
        for name, beam in (("greedy", 1), ("beam", BEAM_SIZE)):
            testdir = os.path.join(logdir, "test_" + name)
            _, seconds["test " + name] = run([sys.executable, "test.py", "--logdir", logdir, "--beam_size",
                                              str(beam), "--alpha", str(LENGTH_PENALTY), "--testdir", testdir], log)
            bleu[name] = read_json(os.path.join(ROOT, testdir, "results.json"))["bleu"]
    seconds["total"] = time.time() - start
    hparams = read_json(os.path.join(ROOT, logdir, "hparams.json"))
    steps_per_epoch = epochs[0][1] if epochs else 1
    results = {
        "minutes": args.minutes, "bleu_greedy": bleu["greedy"], "bleu_beam": bleu["beam"],
        "steps": epochs[-1][1], "epochs": epochs[-1][1] / steps_per_epoch,
        "tgt_tokens_per_s": sum(e[2] for e in epochs) / len(epochs), "precision": hparams["precision"],
        "machine": runtime.machine_summary(), "matmul_gflops_per_s": matmul_gflops(),
        "seconds": {phase: round(s, 1) for phase, s in seconds.items()}, "recipe": RECIPE,
        "beam_size": BEAM_SIZE, "alpha": LENGTH_PENALTY, "logdir": logdir,
    }
    with open(os.path.join(ROOT, logdir, "recipe.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print("\n".join(["", "Multi30k de->en in %g minutes (%s/recipe.json)" % (args.minutes, logdir)]
                    + table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
