"""Adds a finished training run to the recipe's table (scripts/recipe_table.json) as one measured run.

    python scripts/add_recipe_run.py LOGDIR [--data_dir DIR] [--cpu CPU] [--command COMMAND] [--table PATH]

What it reads:
  LOGDIR/hparams.json   which candidate the run trained: every flag of train.py must have the value the candidate's
                        flags (with the table's train_flags) give it, except NOT_COMPARED, and its data dir's
                        vocabulary the candidate's vocab_size (8000 when it names none); and the precision
  LOGDIR/checkpoint     the last checkpoint, whose name train.py writes with the final dev BLEU and the global step
                        (E13_L3.12_B39.11-3066: dev BLEU 39.11, greedy, after 3,066 steps)
  LOGDIR/recipe.json    when scripts/recipe.py trained the run: the CPU and the command (else pass --cpu and
                        --command)
  the data dir          the real target tokens trained, counted by replaying train.py's batching for that many
                        steps (same corpus, length limits, batch size, seed: the same batches)
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from toolkit.base import runtime  # noqa: E402,F401  (first: TensorFlow's environment defaults)

import recipe_table  # noqa: E402
from data_load import epoch_pairs, trained_target_tokens  # noqa: E402
from toolkit.data.datadir import check_vocab, load_manifest  # noqa: E402
from toolkit.base.cli import OneLineParser, run_cli  # noqa: E402
from toolkit.base.errors import UserError
from hparams import Hparams  # noqa: E402
from toolkit.training.logdir import checkpoint_state, load_trained_hparams, trained_data_dir  # noqa: E402
from toolkit.base.writing import atomic_write  # noqa: E402
from toolkit.base.reading import read_json  # noqa: E402
from toolkit.version import __version__  # noqa: E402

#: train.py flags that may differ between a run and its candidate: where things are, when training stops (the
#: run's steps are recorded), how often dev is decoded and checkpoints kept, how the work is spread (same
#: batches), the seed (a repeat of the same settings), the precision (recorded with the run) and the kernels (the same
#: function up to rounding).
NOT_COMPARED = ("data_dir", "logdir", "max_steps", "max_minutes", "num_epochs", "eval_every", "keep_checkpoints",
                "summary_every", "threads", "distribute", "devices", "seed", "precision", "kernels", "ckpt",
                "testdir", "test_batch_size")
#: The name train.py gives the checkpoint of an epoch end that was evaluated on dev: E<epoch>_L<loss>_B<BLEU>-<step>.
EVALUATED_CHECKPOINT = re.compile(r"^E\d+_L[^_]+_B(\d+(?:\.\d+)?)-(\d+)$")


def flag_differences(hp, flags):
    """['--flag RUN (candidate: VALUE)'] for every compared train.py flag whose value in hp (a trained model's
    hyperparameters) differs from what `flags` give it."""
    candidate = vars(Hparams(prog="train.py").parser.parse_args(flags))
    trained = vars(hp)
    return ["--%s %s (candidate: %s)" % (name, trained.get(name), value) for name, value in candidate.items()
            if name not in NOT_COMPARED and trained.get(name) != value]


def candidate_differences(table, name, hp):
    """What in hp (a trained model's hyperparameters) differs from candidate `name`: its flags (flag_differences),
    then the vocabulary, as a run's budget in tokens counts pieces of its own vocabulary."""
    differences = flag_differences(hp, recipe_table.train_flags(table, name))
    vocab_size = recipe_table.vocab_size(table, name)
    if getattr(hp, "vocab_size", None) != vocab_size:
        differences.append("a vocabulary of %s pieces (candidate: %d)" % (getattr(hp, "vocab_size", None),
                                                                          vocab_size))
    return differences


def matching_candidate(table, hp):
    """The name of the table's candidate that hp was trained with (candidate_differences: none); a UserError naming
    the differences from the closest candidate when there is none."""
    differences = {name: candidate_differences(table, name, hp) for name in recipe_table.candidate_names(table)}
    closest = min(differences, key=lambda name: len(differences[name]))
    if differences[closest]:
        raise UserError("%s was trained with settings that are no candidate of the table; the closest, %s, differs "
                        "in %s: add a candidate with the run's flags and vocab_size to the table first"
                        % (hp.logdir, closest, ", ".join(differences[closest])))
    return closest


def final_evaluation(logdir):
    """(global step, dev BLEU) of logdir's last checkpoint, read from its name."""
    state = checkpoint_state(logdir)
    if state is None:
        raise UserError("%s has no checkpoint: train it first" % logdir)
    name = os.path.basename(state.model_checkpoint_path)
    match = EVALUATED_CHECKPOINT.match(name)
    if not match:
        raise UserError("the last checkpoint of %s, %s, has no dev BLEU in its name: the run was interrupted or "
                        "averaged after its final evaluation; resume it to the end of its budget (train.py "
                        "evaluates dev then)" % (logdir, name))
    return int(match.group(2)), float(match.group(1))


def recipe_record(logdir):
    """LOGDIR/recipe.json as a dict, or {} when scripts/recipe.py did not train the run."""
    path = os.path.join(logdir, "recipe.json")
    return read_json(path, "it was damaged; pass --cpu and --command instead") if os.path.exists(path) else {}


def cpu_and_command(logdir, cpu, command):
    """The CPU and command of the run: those given, else those of LOGDIR/recipe.json."""
    record = recipe_record(logdir)
    machine = record.get("machine")
    if not cpu and machine:
        cpu = "%s, %d cores, %s" % (machine["cpu"], machine["cores"],
                                    " ".join(machine["isa_flags"]) or "none of avx2/avx512f/avx512_bf16/amx_bf16")
    command = command or record.get("command")
    if not cpu or not command:
        raise UserError("%s has no recipe.json naming %s: pass --cpu and --command"
                        % (logdir, "the CPU" if not cpu else "the command"))
    return cpu, command


def target_tokens(hp, steps):
    """The real target tokens the run of hp trained in `steps` steps, from its data dir's batches."""
    trained_on = trained_data_dir(hp.logdir)
    manifest = load_manifest(hp.data_dir, trained_on, hp.logdir)
    check_vocab(hp, manifest, trained_on)
    pairs_of = epoch_pairs(hp.data_dir, manifest, "train", hp.maxlen1, hp.maxlen2, hp.truncate, hp.bpe_dropout,
                           hp.seed)
    return trained_target_tokens(pairs_of, steps, hp.batch_size, hp.batch_type, hp.seed, hp.bucket_growth,
                                 hp.accum_steps)


def measured_run(table, logdir, data_dir=None, cpu=None, command=None):
    """The table row of the finished run in logdir (recipe_table.RUN_FIELDS, and the version that adds it)."""
    hp = load_trained_hparams(logdir, {"data_dir": data_dir} if data_dir else {})
    name = matching_candidate(table, hp)
    steps, bleu = final_evaluation(logdir)
    cpu, command = cpu_and_command(logdir, cpu, command)
    return {"candidate": name, "target_tokens": target_tokens(hp, steps), "steps": steps,
            "batch_size": hp.batch_size, "dev_bleu": bleu, "precision": hp.precision, "cpu": cpu,
            "command": command, "source": "logdir %s" % os.path.normpath(logdir), "version": __version__}


def main(argv=None):
    parser = OneLineParser(prog="add_recipe_run.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="NOT_COMPARED: %s." % ", ".join("--" + flag for flag in NOT_COMPARED))
    parser.add_argument("logdir", help="the finished run's logdir (train.py's or scripts/recipe.py's)")
    parser.add_argument("--data_dir", help="the data dir it trained on (default: the one in LOGDIR/hparams.json, "
                                           "relative to where it was trained)")
    parser.add_argument("--cpu", help="the CPU it trained on (default: LOGDIR/recipe.json's)")
    parser.add_argument("--command", help="the command that trained it (default: LOGDIR/recipe.json's)")
    parser.add_argument("--table", default=recipe_table.TABLE_PATH, help="the table file to add the run to")
    args = parser.parse_args(argv)
    table = recipe_table.load_table(args.table)
    run = measured_run(table, args.logdir, args.data_dir, args.cpu, args.command)
    if any(all(old[key] == run[key] for key in ("candidate", "target_tokens", "steps", "dev_bleu"))
           for old in table["runs"]):
        raise UserError("%s already has this run (%s, %d steps, dev BLEU %.2f)" % (
            args.table, run["candidate"], run["steps"], run["dev_bleu"]))
    table["runs"].append(run)
    atomic_write(args.table, recipe_table.format_table(table))
    print("added to %s: %s, %d steps, %.2f M target tokens, dev BLEU %.2f" % (
        args.table, run["candidate"], run["steps"], run["target_tokens"] / 1e6, run["dev_bleu"]))
    return 0


if __name__ == "__main__":
    run_cli(main)
