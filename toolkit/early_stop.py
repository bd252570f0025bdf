"""Where training ends early or has nothing left to do: --patience (dev evaluations in a row without
a better BLEU) and a resumed run whose budget is already spent."""
from toolkit.errors import UserError
from toolkit.logdir import read_best


def check_patience(hp):
    """--patience counts dev evaluations of the one process that makes them."""
    if hp.patience and not hp.eval_every:
        raise UserError("--patience %d counts dev evaluations, which --eval_every 0 leaves to the "
                        "end: pass --eval_every 1 or more" % hp.patience)
    if hp.patience and hp.distribute == "multiworker":
        raise UserError("--patience needs a run in one process: it is not supported with "
                        "--distribute multiworker")


def early_stop(hp, best):
    """Why --patience ends training (a phrase) given best.json's dict (logdir.read_best), or
    None."""
    if not (hp.patience and best and best["evals_without_gain"] >= hp.patience):
        return None
    return ("--patience %d: %d dev evaluations in a row without a better BLEU than %.2f, that of %s"
            % (hp.patience, best["evals_without_gain"], best["bleu"], best["checkpoint"]))


def nothing_to_do(hp, budget, step, epoch):
    """The line a resumed run prints when its logdir has already trained to the end of its budget or
    stopped early (--patience), naming that end and how to train longer; None when there is training
    left."""
    stopped = early_stop(hp, read_best(hp.logdir))
    if stopped:
        return ("nothing to do: %s stopped early, %s; to train longer, resume with a higher "
                "--patience" % (hp.logdir, stopped))
    if budget.decaying and budget.total and step >= budget.total:
        end = "its --lr_schedule %s decayed to 0 at step %d" % (hp.lr_schedule, budget.total)
    elif hp.max_steps and step >= hp.max_steps:
        end = "--max_steps %d (given, or saved in its hparams.json)" % hp.max_steps
    elif epoch >= hp.num_epochs:
        end = "--num_epochs %d (given, or saved in its hparams.json)" % hp.num_epochs
    else:
        return None
    longer = ("start a new --logdir, or resume with --lr_schedule noam (which has no end) and a "
              "higher --max_steps or --num_epochs" if budget.decaying else "resume with a higher "
              "--max_steps or --num_epochs")
    return ("nothing to do: %s is at step %d (%d epochs done), where %s ends training; to train "
            "longer, %s" % (hp.logdir, step, epoch, end, longer))
