"""Fine-tuning on what users corrected: train.py --init_from RUN --suggestions DB --logdir NEW
(docs/corrections.md).

Before training, prepare() reads the suggestions of RUN's direction from serve.py's database
(toolkit/serving/suggestions.py), holds out --suggestions_heldout of them under --seed, and builds a
data dir with RUN's bpe.model (toolkit/data/build.py, as prepro.py --bpe_model builds one)::

    NEW/corrections_data/   train: the suggestions not held out, and --replay_ratio pairs of RUN's
                            training split for each; eval: RUN's dev split; test: the held-out ones
    NEW/corrections.json    what was built and from what; after training, the BLEU before and after
    NEW/REJECTED.json       the tools refuse NEW while it is there (logdir.check_not_rejected)

train.py then trains NEW as usual on that data dir. After training, judge() decodes the dev split
and the held-out suggestions with RUN's checkpoint (before) and NEW's last one (after), as train.py
decodes the dev set, and scores them with sacreBLEU. NEW is kept (REJECTED.json removed) only when
the held-out BLEU rises and dev BLEU falls by at most --max_dev_drop; otherwise REJECTED.json says
why and train.py exits with REJECTED_EXIT_CODE. RUN's logdir is only read.
"""
import collections
import os
import random
import sys

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from data_load import eval_order, get_batch
from decoding import DecodingSettings, translate
from fast import build_transformer
from hparams import Hparams
from model import ModelConfig
from toolkit.base import machine
from toolkit.base.errors import UserError
from toolkit.base.reading import clean_line, iter_lines, read_json, read_lines
from toolkit.base.writing import same_file, write_json
from toolkit.data.build import build_data_dir, read_bpe_model
from toolkit.data.corpora import FILE_FLAGS, unzip_pairs
from toolkit.data.datadir import bpe_model_path, languages, load_manifest, split_paths
from toolkit.training.logdir import (REJECTED_NAME, check_not_rejected, clear_rejected,
                                     find_checkpoint, mark_rejected, restore, saved_hparams)
from utils import calc_bleu, get_hypotheses

tf1 = tf.compat.v1

#: What NEW holds besides a training run's files (see the module docstring).
DATA_DIR_NAME = "corrections_data"
RESULTS_NAME = "corrections.json"
#: train.py's exit code when the gate rejects the fine-tune (2 is a user error, 130/143 a signal).
REJECTED_EXIT_CODE = 3
#: The flags that only mean something with --suggestions.
SUGGESTION_FLAGS = ("suggestions_heldout", "replay_ratio", "max_dev_drop")
#: Their defaults, which a run without --suggestions records.
SUGGESTION_DEFAULTS = {flag: Hparams().parser.get_default(flag) for flag in SUGGESTION_FLAGS}
#: prepro.py's --max_ratio default: the length ratio above which build.py reports a pair.
MAX_RATIO = 9.0
#: The splits judge() scores, and what they are called in its summary.
JUDGED = {"test": "held-out suggestions", "eval": "dev"}


# ----------------------------------------------------------------------------------------------
# The flags


def check_flags(given, distribute, resumed=None):
    """Refuses --suggestions without --init_from, or with --data_dir (its data dir is built) or one
    process per worker; the flags of --suggestions without it; and a resumed run (resumed: its
    logdir) given other suggestions than it was started with. given: the flags given (with
    --config's), distribute: --distribute."""
    recorded = saved_hparams(resumed).get("suggestions", "") if resumed else ""
    wanted = given.get("suggestions")
    if resumed and wanted and not (wanted == recorded or recorded and same_file(wanted, recorded)):
        raise UserError("--logdir %s already holds a run, %s: pass a new --logdir to fine-tune on "
                        "--suggestions %s" % (resumed, "fine-tuned on --suggestions %s" % recorded
                                              if recorded else "not one on suggestions", wanted))
    if not (wanted or recorded):
        # another run's hparams.json (--config) holds their defaults
        extra = [flag for flag in SUGGESTION_FLAGS
                 if given.get(flag, SUGGESTION_DEFAULTS[flag]) != SUGGESTION_DEFAULTS[flag]]
        if extra:
            raise UserError("--%s is for a fine-tune on suggestions: give --suggestions DB "
                            "--init_from RUN, or leave it out" % extra[0])
    if resumed or not wanted:
        return
    if not given.get("init_from"):
        raise UserError("--suggestions %s fine-tunes a trained model: give --init_from RUN, the "
                        "logdir (or checkpoint) of the model whose translations users corrected"
                        % wanted)
    if "data_dir" in given:
        raise UserError("--data_dir %s: with --suggestions the data dir is built in "
                        "LOGDIR/%s from the suggestions and RUN's data dir; leave --data_dir out"
                        % (given["data_dir"], DATA_DIR_NAME))
    if distribute == "multiworker":
        raise UserError("--suggestions fine-tunes in one process: leave out --distribute "
                        "multiworker")


# ----------------------------------------------------------------------------------------------
# Before training: the data dir


def prepare(hp, source, base_ckpt, open_store):
    """Builds NEW's data dir (hp.logdir/DATA_DIR_NAME) for a new fine-tune on hp.suggestions, marks
    NEW not judged yet and writes the plan in RESULTS_NAME; returns the data dir. source: the
    hparams of --init_from's run (flags.init_source), base_ckpt: its checkpoint; open_store: opens
    the database at a path as a toolkit.serving.suggestions.Store (train.py passes the class: the
    serving layer lies above this one)."""
    check_not_rejected(source.logdir)
    manifest = load_manifest(source.data_dir, source.data_dir, source.logdir, ("train", "eval"))
    direction = languages(manifest)
    pairs = read_pairs(hp.suggestions, direction, open_store)
    trained, held_out = split_pairs(pairs, hp.suggestions_heldout, hp.seed, hp.suggestions,
                                    direction)
    replayed = replay_pairs(source.data_dir, manifest, round(hp.replay_ratio * len(trained)),
                            hp.seed)
    os.makedirs(hp.logdir, exist_ok=True)
    mark_rejected(hp.logdir, "its fine-tune on suggestions has not been judged yet",
                  "run its train.py command again to finish training and judge it")
    data_dir = build(hp, source.data_dir, manifest, trained + replayed, held_out)
    plan = {"suggestions": hp.suggestions, "direction": "%s->%s" % direction,
            "base": {"logdir": source.logdir, "checkpoint": base_ckpt}, "pairs": len(pairs),
            "trained": len(trained), "held_out": len(held_out), "replayed": len(replayed),
            "data_dir": data_dir}
    write_json(os.path.join(hp.logdir, RESULTS_NAME), plan)
    print("%s; data dir %s" % (describe(plan), data_dir), flush=True)
    return data_dir


def read_pairs(path, direction, open_store):
    """The (source text, suggested translation) pairs of the database at path in direction (source
    and target language), oldest first, cleaned as prepro.py cleans text; pairs with an empty side
    are left out. A missing database is a UserError (Store would create an empty one)."""
    if not os.path.isfile(path):
        raise UserError("--suggestions %s %s: pass the suggestions database that serve.py writes"
                        % (path, "is not a file" if os.path.exists(path) else "not found"))
    store = open_store(path)
    try:
        pairs = store.pairs(*direction)
    finally:
        store.close()
    pairs = [(clean_line(q), clean_line(s)) for q, s in pairs]
    return [(q, s) for q, s in pairs if q and s]


def held_out_count(pairs, fraction):
    """How many of `pairs` pairs --suggestions_heldout `fraction` holds out (rounded half up)."""
    return int(pairs * fraction + 0.5)


def pairs_needed(fraction):
    """The fewest pairs of which `fraction` holds out at least one and leaves one to train on."""
    count = 2
    while not 1 <= held_out_count(count, fraction) < count:
        count += 1
    return count


def split_pairs(pairs, fraction, seed, path, direction):
    """(trained, held out): the pairs whose source texts, shuffled under seed, come first are held
    out until held_out_count of them are; the pairs of one source text stay together, and each
    list keeps the database's order. Too few pairs is a UserError saying how many are needed."""
    needed = pairs_needed(fraction)
    if len(pairs) < needed:
        raise UserError("--suggestions %s holds %d suggestion pairs %s->%s (not rejected), but "
                        "--suggestions_heldout %g needs at least %d, to hold out one and train on "
                        "the others: collect more suggestions, or change --suggestions_heldout"
                        % (path, len(pairs), *direction, fraction, needed))
    sizes = collections.Counter(q for q, _ in pairs)
    sources = sorted(sizes)
    random.Random(seed).shuffle(sources)
    held, count = set(), 0
    for q in sources:
        if count >= held_out_count(len(pairs), fraction):
            break
        held.add(q)
        count += sizes[q]
    trained = [pair for pair in pairs if pair[0] not in held]
    if not trained:
        raise UserError("--suggestions %s: its %d pairs %s->%s are suggestions for %d source "
                        "text(s), all held out (the pairs of a source text stay together): collect "
                        "suggestions for more texts, or lower --suggestions_heldout"
                        % (path, len(pairs), *direction, len(sources)))
    return trained, [pair for pair in pairs if pair[0] in held]


def replay_pairs(data_dir, manifest, count, seed):
    """count pairs of the training split of data_dir (its cleaned text), drawn under seed without
    repeats while there are enough, in the file's order; read in one pass, holding only those."""
    lines = manifest["splits"]["train"]["lines"]
    if not count or not lines:
        return []
    chosen = np.random.default_rng(seed).choice(lines, count, replace=count > lines)
    copies = collections.Counter(chosen.tolist())
    files = split_paths(data_dir, manifest, "train")
    pairs = []
    for line, pair in enumerate(zip(iter_lines(files["raw1"]), iter_lines(files["raw2"]))):
        pairs += [pair] * copies.get(line, 0)
    return pairs


def build(hp, run_data_dir, manifest, train, test):
    """Builds hp.logdir/DATA_DIR_NAME as prepro.py --bpe_model builds a data dir, with the bpe.model
    of run_data_dir (manifest: its manifest): the pairs train and test, and its dev split."""
    data_dir = os.path.join(hp.logdir, DATA_DIR_NAME)
    dev = split_paths(run_data_dir, manifest, "eval")
    splits = {"train": unzip_pairs(train), "eval": (read_lines(dev["raw1"]),
                                                    read_lines(dev["raw2"])),
              "test": unzip_pairs(test)}
    bpe_model = read_bpe_model(bpe_model_path(run_data_dir, manifest))
    build_data_dir(data_dir, splits, build_options(hp, languages(manifest), bpe_model),
                   split_sources(hp.suggestions, run_data_dir), force=True, bpe_model=bpe_model)
    return data_dir


def build_options(hp, direction, bpe_model):
    """The build's options (build.build_data_dir): prepro.py's defaults, RUN's direction and
    bpe.model, and what chose the pairs."""
    return {"dataset": "corrections", "vocab_size": bpe_model.size, "dedup": False,
            "filter_ratio": False, "max_ratio": MAX_RATIO, "src_lang": direction[0],
            "tgt_lang": direction[1], "bpe_model_sha256": bpe_model.sha256,
            "suggestions": hp.suggestions, "suggestions_heldout": hp.suggestions_heldout,
            "replay_ratio": hp.replay_ratio, "seed": hp.seed, "init_from": hp.init_from}


def split_sources(suggestions, run_data_dir):
    """Where each side of each split comes from, for the manifest (keys train1 ... test2)."""
    where = {"train": "suggestions in %s not held out, and pairs replayed from %s"
             % (suggestions, run_data_dir), "eval": "the dev split of %s" % run_data_dir,
             "test": "suggestions in %s held out" % suggestions}
    return {flag: where[split] for (split, _), flag in FILE_FLAGS.items()}


# ----------------------------------------------------------------------------------------------
# After training: the gate


def judge(hp):
    """Scores RUN's checkpoint and NEW's last one on the dev split and the held-out suggestions,
    prints the summary, writes RESULTS_NAME, and keeps or rejects NEW (hp.logdir). Returns
    train.py's exit code: 0 when kept, REJECTED_EXIT_CODE when not."""
    path = os.path.join(hp.logdir, RESULTS_NAME)
    record = read_json(path, "fine-tune again in a new --logdir")
    manifest = load_manifest(hp.data_dir, splits=tuple(JUDGED))
    base = record["base"]
    record["before"] = scores(hp, manifest, base["checkpoint"], base["logdir"])
    record["after"] = scores(hp, manifest, find_checkpoint(hp.logdir), hp.logdir)
    reason = rejection(record["before"], record["after"], hp.max_dev_drop)
    record.update(max_dev_drop=hp.max_dev_drop, kept=reason is None, reason=reason)
    write_json(path, record)
    print(summary(record), flush=True)
    if reason is None:
        clear_rejected(hp.logdir)
        print("kept: %s (%s)" % (hp.logdir, path), flush=True)
        return 0
    mark_rejected(hp.logdir, reason, "keep using %s, which it was fine-tuned from, or fine-tune "
                                     "again with other suggestions or flags" % base["logdir"],
                  results=path)
    print("rejected: %s; %s is marked rejected (%s)"
          % (reason, hp.logdir, os.path.join(hp.logdir, REJECTED_NAME)), file=sys.stderr,
          flush=True)
    return REJECTED_EXIT_CODE


def scores(hp, manifest, ckpt, logdir):
    """{"checkpoint", "dev_bleu", "held_out_bleu"} of checkpoint ckpt (of logdir) on the data dir
    hp.data_dir (manifest), decoded with hp's decoding flags as train.py decodes the dev set."""
    sp = spm.SentencePieceProcessor(model_file=bpe_model_path(hp.data_dir, manifest))
    with tf.Graph().as_default():
        datasets = {split: get_batch(hp.data_dir, manifest, split, None, None,
                                     hp.test_batch_size) for split in JUDGED}
        first = datasets["eval"][0]
        iterator = tf1.data.Iterator.from_structure(tf1.data.get_output_types(first),
                                                    tf1.data.get_output_shapes(first))
        xs, _ = iterator.get_next()
        ids, ids_scores = translate(build_transformer(ModelConfig.from_flags(hp)), xs,
                                    DecodingSettings.from_flags(hp))
        with tf1.Session(config=machine.session_config(hp)) as sess:
            restore(sess, ckpt, logdir)
            bleu = {}
            for split, (batches, num_batches, _, _) in datasets.items():
                try:
                    hypotheses, _ = get_hypotheses(
                        sess, iterator.make_initializer(batches), ids, xs.x_seqlen, num_batches(),
                        eval_order(hp.data_dir, manifest, split), sp, JUDGED[split], ids_scores)
                except FloatingPointError as error:
                    raise UserError("%s with %s: its weights diverged" % (error, ckpt)) from None
                references = read_lines(split_paths(hp.data_dir, manifest, split)["raw2"])
                bleu[split] = round(calc_bleu(references, hypotheses)[0], 2)
    return {"checkpoint": ckpt, "dev_bleu": bleu["eval"], "held_out_bleu": bleu["test"]}


def rejection(before, after, max_dev_drop):
    """Why the fine-tune is rejected (its before and after scores), or None when it is kept."""
    reasons = []
    if not after["held_out_bleu"] > before["held_out_bleu"]:
        reasons.append("the held-out suggestions' BLEU did not improve (%.2f -> %.2f)"
                       % (before["held_out_bleu"], after["held_out_bleu"]))
    drop = round(before["dev_bleu"] - after["dev_bleu"], 2)
    if drop > max_dev_drop:
        reasons.append("dev BLEU dropped by %.2f (%.2f -> %.2f), more than --max_dev_drop %g"
                       % (drop, before["dev_bleu"], after["dev_bleu"], max_dev_drop))
    return "; ".join(reasons) or None


def summary(record):
    """The before / after table of a judged record, as printed lines."""
    before, after = record["before"], record["after"]
    lines = [describe(record), "  %-22s %8s %8s %8s" % ("BLEU", "before", "after", "change")]
    for key, name in (("held_out_bleu", "held-out suggestions"), ("dev_bleu", "dev")):
        lines.append("  %-22s %8.2f %8.2f %+8.2f" % (name, before[key], after[key],
                                                     after[key] - before[key]))
    lines.append("  before: %s; after: %s; dev may drop by %g at most (--max_dev_drop)"
                 % (before["checkpoint"], after["checkpoint"], record["max_dev_drop"]))
    return "\n".join(lines)


def describe(plan):
    """One line on the pairs of a fine-tune's plan (prepare's record)."""
    return ("corrections: %d suggestion pairs %s in %s: %d trained on, with %d pairs of %s's "
            "training split replayed; %d held out" % (
                plan["pairs"], plan["direction"], plan["suggestions"], plan["trained"],
                plan["replayed"], plan["base"]["logdir"], plan["held_out"]))
