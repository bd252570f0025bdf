"""Using a trained model beyond the basics: fine-tuning on a new corpus with the same vocabulary (prepro.py
--bpe_model, train.py --init_from), early stopping and the best checkpoint (--patience, --ckpt best), forced
decoding scores (translate.py --score), scoring file pairs (test.py --src/--ref) and flags from a file (--config)."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import export
import prepro
import test as test_cli
import train
import translate
from data_load import Sources, Targets
from in_process import run_in_process
from toolkit.base.errors import UserError
from toolkit.training.logdir import find_checkpoint, load_trained_hparams, save_hparams
from model import BOS_ID, EOS_ID, ModelConfig, Transformer

tf1 = tf.compat.v1
#: The shape of conftest.py's tiny_model, and what a run of a few steps on its corpus needs.
TINY = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2"]
SHORT_RUN = ["--batch_size", "1500", "--test_batch_size", "100", "--precision", "fp32", "--kernels", "tf"]
#: What --help says of --ckpt best.
BEST_HELP = "best: the best by dev BLEU (LOGDIR/best.json)"


def numbers(data_dir, *flags):
    """A numbers data dir of 300 training pairs and 20 dev and test pairs at data_dir."""
    assert prepro.main(["--dataset", "numbers", "--n_train", "300", "--n_eval", "20", "--n_test", "20",
                        "--data_dir", str(data_dir), *flags]) == 0
    return str(data_dir)


def lines_of(path, count=None):
    return open(path, encoding="utf-8").read().split("\n")[:-1][:count]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def error_line(code, err):
    """The one error line of a tool that exited with code 2, without a traceback."""
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


def scores(capsys, logdir, source, reference, *flags):
    """translate.py --score: [(log p, normalized)] of each pair."""
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--input", source,
                                    "--score", reference, *flags)
    assert code == 0, err
    return [tuple(map(float, line.split("\t"))) for line in out.splitlines()]


# ------------------------------------------------------------------------------------------------
# Fine-tuning


def test_a_model_continues_on_a_new_corpus_with_its_vocabulary(tiny_model, tmp_path, capsys):
    source_logdir, source_data = tiny_model
    new_data = numbers(tmp_path / "new", "--seed", "2", "--bpe_model", os.path.join(source_data, "bpe.model"))
    fine, fresh = str(tmp_path / "fine"), str(tmp_path / "fresh")
    # a rate too small to move a weight: each run's one step leaves the weights it started with
    start = ["--data_dir", new_data, "--max_steps", "1", "--lr", "1e-12", "--warmup_steps", "1", *SHORT_RUN]
    assert train.main(["--logdir", fine, "--init_from", source_logdir, *start]) == 0  # model shape from the source
    assert train.main(["--logdir", fresh, *TINY, *start]) == 0
    assert "weights from %s" % tf.train.latest_checkpoint(source_logdir) in capsys.readouterr().out
    checkpoint = tf.train.load_checkpoint(tf.train.latest_checkpoint(fine))
    assert checkpoint.get_tensor("global_step") == 1 and checkpoint.get_tensor("lr_schedule_total_steps") == 1
    assert json.load(open(os.path.join(fine, "hparams.json")))["d_model"] == 32

    dev1, dev2 = (os.path.join(new_data, name) for name in ("eval.1", "eval.2"))
    fine_log_p, fresh_log_p = (sum(log_p for log_p, _ in scores(capsys, logdir, dev1, dev2))
                               for logdir in (fine, fresh))
    assert fine_log_p > fresh_log_p + 100  # the dev loss at the start: far lower from the trained weights

    own_bpe = numbers(tmp_path / "own_bpe", "--seed", "2", "--vocab_size", "300")
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", tmp_path / "refused", "--data_dir",
                                  own_bpe, "--init_from", source_logdir)
    assert error_line(code, err).startswith("error: --init_from %s was trained with another BPE vocabulary "
                                            "(bpe.vocab) than --data_dir %s has" % (source_logdir, own_bpe))
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", tmp_path / "refused", "--data_dir",
                                  new_data, "--init_from", source_logdir, "--d_ff", "128")
    assert "holds a model with --d_ff 64 but this run asks for 128" in error_line(code, err)
    assert not os.path.exists(tmp_path / "refused")


def test_weights_of_another_shape_are_refused_naming_the_variable(tiny_model, tmp_path, capsys):
    """A source whose hparams.json (edited) no longer describes its checkpoint: the variables' shapes differ."""
    logdir, data_dir = tiny_model
    source = shutil.copytree(logdir, tmp_path / "source")
    hparams = json.loads((source / "hparams.json").read_text())
    (source / "hparams.json").write_text(json.dumps({**hparams, "d_ff": 128}))
    code, _, err = run_in_process(capsys, "train.py", train.main, "--logdir", tmp_path / "run", "--data_dir",
                                  data_dir, "--init_from", source, *SHORT_RUN)
    assert error_line(code, err) == ("error: --init_from %s (%s) does not fit the model of this run: encoder/"
                                     "num_blocks_0/positionwise_feedforward/inner/kernel is [32, 64] in the "
                                     "checkpoint but [32, 128] in the model"
                                     % (source, tf.train.latest_checkpoint(str(source))))


# ------------------------------------------------------------------------------------------------
# Early stopping and the best checkpoint


@pytest.mark.slow
def test_patience_stops_early_and_test_takes_the_best_checkpoint(tmp_path, capsys):
    data_dir, logdir = numbers(tmp_path / "data", "--vocab_size", "200"), str(tmp_path / "run")
    # weights that never move: the second dev evaluation's BLEU is the first's, no gain
    assert train.main(["--data_dir", data_dir, "--logdir", logdir, *TINY, *SHORT_RUN, "--lr", "1e-12",
                       "--max_steps", "1000", "--num_epochs", "50", "--patience", "1", "--keep_checkpoints", "1"]) == 0
    out = capsys.readouterr().out
    evals = [(int(step), float(bleu)) for step, bleu in re.findall(r"step (\d+) \| .* dev BLEU ([\d.]+)", out)]
    steps = int(re.search(r"done: step (\d+)", out).group(1))
    assert len(evals) == 2 and steps == evals[1][0] < 1000 and "early stop: --patience 1" in out
    best = json.load(open(os.path.join(logdir, "best.json")))
    assert (best["step"], round(best["bleu"], 2)) == evals[0] and best["evals_without_gain"] == 1
    assert best["checkpoint"] == "best-%d" % evals[0][0]
    assert tf.train.latest_checkpoint(logdir).endswith("-%d" % steps)
    assert not [name for name in os.listdir(logdir) if name.startswith("E01")]  # rotated away by --keep_checkpoints

    testdir = str(tmp_path / "test")
    assert test_cli.main(["--logdir", logdir, "--ckpt", "best", "--testdir", testdir]) == 0
    results = json.load(open(os.path.join(testdir, "results.json")))
    assert results["checkpoint"] == os.path.join(logdir, best["checkpoint"])
    assert tf.train.load_checkpoint(results["checkpoint"]).get_tensor("global_step") == best["step"]

    assert train.main(["--logdir", logdir]) == 0  # resumed: the evaluation without gain still counts
    assert "nothing to do: %s stopped early, --patience 1" % logdir in capsys.readouterr().out


def test_best_is_resolved_in_one_place_for_every_tool(tiny_model, tmp_path):
    logdir, _ = tiny_model  # trained with one dev evaluation, at its end
    best = json.load(open(os.path.join(logdir, "best.json")))
    assert best["checkpoint"] == "best-60" and best["evals_without_gain"] == 0
    assert find_checkpoint(logdir, "best") == find_checkpoint(str(tmp_path), os.path.join(logdir, "best")) \
        == os.path.join(logdir, "best-60")
    with pytest.raises(UserError, match="--ckpt best: %s has no best.json yet: train.py writes it at the first dev "
                                        "evaluation" % tmp_path):
        find_checkpoint(str(tmp_path), "best")


# ------------------------------------------------------------------------------------------------
# Forced decoding scores


def teacher_forced_log_p(logdir, data_dir, source, reference):
    """log p(reference + </s> | source) from the decoder's logits at the reference's tokens, summed."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "bpe.model"))
    x, y = sp.encode(source) + [EOS_ID], sp.encode(reference) + [EOS_ID]
    with tf.Graph().as_default(), tf1.Session() as sess:
        model = Transformer(ModelConfig.from_flags(load_trained_hparams(logdir, {})))
        memory, src_masks = model.encode(Sources(tf.constant([x]), tf.constant([len(x)])), training=False)
        targets = Targets(tf.constant([[BOS_ID] + y[:-1]]), tf.constant([y]), tf.constant([len(y)]))
        logits = model.decode(targets, memory, src_masks, training=False)[0]
        tf1.train.Saver().restore(sess, tf.train.latest_checkpoint(logdir))
        logits = sess.run(logits)[0].astype(np.float64)  # (T, V)
    log_softmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    return log_softmax[np.arange(len(y)), y].sum(), len(y)


def test_score_is_the_teacher_forced_log_probability(tiny_model, tmp_path, capsys):
    logdir, data_dir = tiny_model
    sources = lines_of(os.path.join(data_dir, "test.1"), 2) + ["elf"]
    references = lines_of(os.path.join(data_dir, "test.2"), 2) + [""]  # an empty reference: </s> alone
    printed = scores(capsys, logdir, write_lines(tmp_path / "src", sources), write_lines(tmp_path / "ref", references),
                     "--alpha", "1.5")
    assert len(printed) == 3
    for (log_p, normalized), source, reference in zip(printed, sources, references):
        expected, length = teacher_forced_log_p(logdir, data_dir, source, reference)
        assert log_p == pytest.approx(expected, abs=1e-3)
        assert normalized == pytest.approx(log_p / ((5 + length) / 6) ** 1.5, abs=1e-5)

    code, _, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--input",
                                  tmp_path / "src", "--score", write_lines(tmp_path / "short", ["one"]))
    assert error_line(code, err) == ("error: --input %s has 3 lines but --score %s has 1: give one reference line "
                                     "per source line" % (tmp_path / "src", tmp_path / "short"))


# ------------------------------------------------------------------------------------------------
# test.py --src/--ref


def test_test_scores_file_pairs_with_bleu_and_chrf(tiny_model, tmp_path, capsys):
    logdir, data_dir = tiny_model
    sources = write_lines(tmp_path / "src", lines_of(os.path.join(data_dir, "test.1"), 12))
    references = write_lines(tmp_path / "ref", lines_of(os.path.join(data_dir, "test.2"), 12))
    code, translations, _ = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir, "--input",
                                           sources)
    assert code == 0 and len(set(translations.splitlines())) > 3
    own = write_lines(tmp_path / "own", translations.splitlines())  # translate.py's output: a perfect reference
    code, out, _ = run_in_process(capsys, "test.py", test_cli.main, "--logdir", logdir, "--testdir", tmp_path / "t",
                                  "--src", sources, sources, "--ref", references, own)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    bleu, chrf = (float(value) for value in re.search(r"BLEU = ([\d.]+)  chrF = ([\d.]+)", lines[0]).groups())
    assert lines[0].startswith(sources) and 0 < chrf < 100 and bleu < 100
    assert lines[1].startswith("%s: BLEU = 100.00  chrF = 100.00  (12 sentences" % sources)
    assert [pair["bleu"] for pair in json.load(open(tmp_path / "t" / "files.json"))["pairs"]] == [bleu, 100.0]

    code, _, err = run_in_process(capsys, "test.py", test_cli.main, "--logdir", logdir, "--src", sources, sources,
                                  "--ref", own)
    assert error_line(code, err) == ("error: 2 --src files but 1 --ref files: give one --ref file per --src file, "
                                     "in the same order")


# ------------------------------------------------------------------------------------------------
# --config


def test_config_flags_come_from_a_file_under_the_command_line(tmp_path, capsys):
    data_dir = numbers(tmp_path / "data", "--vocab_size", "200")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"d_model": 48, "d_ff": 96, "num_heads": 4, "data_dir": data_dir}))
    hp, _ = train.resolve_hparams(["--config", str(config), "--d_ff", "80", "--logdir", str(tmp_path / "a"),
                                   "--kernels", "tf"])
    assert (hp.d_model, hp.d_ff, hp.num_heads, hp.data_dir, hp.vocab_size) == (48, 80, 4, data_dir, 200)

    save_hparams(hp, str(tmp_path))  # a run's hparams.json: its logdir is not taken, the rest is
    again, _ = train.resolve_hparams(["--config", str(tmp_path / "hparams.json"), "--logdir", str(tmp_path / "b")])
    assert vars(again) == {**vars(hp), "logdir": str(tmp_path / "b"), "config": str(tmp_path / "hparams.json")}

    config.write_text(json.dumps({"d_model": 48, "dmodel": 32}))
    code, _, err = run_in_process(capsys, "train.py", train.main, "--config", config, "--logdir", tmp_path / "c")
    assert error_line(code, err) == ("error: --config %s: unknown key \"dmodel\", not a flag of train.py: remove it "
                                     "(train.py --help lists the flags)" % config)


def test_new_flags_are_explained_in_help(capsys):
    for name, main, explained in (("prepro.py", prepro.main, ["--bpe_model PATH segment with"]),
                                  ("translate.py", translate.main, ["--score REF with --input SRC", BEST_HELP]),
                                  ("test.py", test_cli.main, ["--src FILE [FILE ...] score", BEST_HELP]),
                                  ("export.py", export.main, [BEST_HELP]),
                                  ("train.py", train.main, ["--init_from LOGDIR_OR_CHECKPOINT start a new logdir",
                                                            "--patience PATIENCE stop after", "--config FILE take"])):
        code, help_text, _ = run_in_process(capsys, name, main, "--help")
        help_text = " ".join(help_text.split())  # as wrapped for any terminal width
        assert code == 0 and all(text in help_text for text in explained), (name, help_text)
