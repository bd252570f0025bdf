"""--ensemble: models decoded together by the mean of their log-probabilities at each step
(decoding.Ensemble, built by trained_model.TrainedModel), with the session's tiny trained model
(conftest.py), a smaller one trained briefly on its data dir, and one of another vocabulary."""
import os

import numpy as np
import pytest
import tensorflow as tf

import decoding
import prepro
import train
import translate
from data_load import Sources, pad
from in_process import run_in_process
from toolkit.base.ids import EOS_ID
from toolkit.training.logdir import find_checkpoint
from toolkit.translating.trained_model import TrainedModel, trained_hparams

tf1 = tf.compat.v1

SENTENCES = ["Er zählt bis elf.", "dreihundertzehn", "zweiundvierzig und sieben",
             "Sie hat neunzehn Bücher."]


def train_run(data_dir, logdir, steps, d_model):
    """A 1-block model of width d_model trained `steps` steps on data_dir into logdir."""
    assert train.main(["--data_dir", data_dir, "--logdir", logdir, "--max_steps", str(steps),
                       "--d_model", str(d_model), "--d_ff", "64", "--num_blocks", "1",
                       "--num_heads", "2", "--batch_size", "2000", "--lr", "0.01",
                       "--warmup_steps", "20", "--dropout_rate", "0", "--maxlen1", "20",
                       "--maxlen2", "30", "--eval_every", "100", "--precision", "fp32"]) == 0
    return logdir


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    """{"main", "other", "vocab"}: logdirs of the tiny model, of a narrower one (d_model 16) on its
    data dir, and of one on a data dir of another vocabulary size (its bpe.model differs)."""
    logdir, data_dir = tiny_model
    root = tmp_path_factory.mktemp("ensemble")
    other_data = str(root / "data250")
    assert prepro.main(["--dataset", "numbers", "--n_train", "300", "--n_eval", "5", "--n_test",
                        "5", "--vocab_size", "250", "--data_dir", other_data]) == 0
    return {"main": logdir,
            "other": train_run(data_dir, str(root / "other"), 30, 16),
            "vocab": train_run(other_data, str(root / "vocab"), 1, 16)}


def session_of(logdir, members, build_fn, impl="fast"):
    """Runs build_fn(model, xs over placeholders) in a new graph over the TrainedModel of logdir
    with --ensemble members (and --impl impl). Returns its outputs fed SENTENCES, and that batch
    (x (N, T1), x_seqlen (N,))."""
    hp = trained_hparams(logdir, {"ensemble": members, "impl": impl})
    trained = TrainedModel(hp, hp.ckpt)
    sp = trained.sentencepiece()
    x, x_seqlen = pad([sp.encode(text) + [EOS_ID] for text in SENTENCES])
    with tf.Graph().as_default():
        x_ph, seqlen_ph = tf1.placeholder(tf.int32, [None, None]), tf1.placeholder(tf.int32, [None])
        outputs = build_fn(trained.build(), Sources(x_ph, seqlen_ph))
        with trained.session() as sess:
            return sess.run(outputs, {x_ph: x, seqlen_ph: x_seqlen}), (x, x_seqlen)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(runs, impl):
    def build(ensemble, xs):
        single = ensemble.models[0]
        return {(name, beam): decoding.search(model, xs, decoding.DecodingSettings(beam_size=beam),
                                              1)[:2]
                for name, model in (("single", single), ("ensemble", ensemble))
                for beam in (1, 4)}
    outputs, _ = session_of(runs["main"], [runs["main"]], build, impl)
    for beam in (1, 4):
        (ids, scores), (ensemble_ids, ensemble_scores) = (outputs["single", beam],
                                                          outputs["ensemble", beam])
        np.testing.assert_array_equal(ensemble_ids, ids)
        np.testing.assert_allclose(ensemble_scores, scores, atol=1e-5)


def log_softmax(logits):
    """numpy log_softmax over the last axis."""
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def mean_log_probs(logits):
    """The mean over models of their log-probabilities (logits: per model (N, T, V)),
    renormalized, with the outputs a decoder never makes at NEG_INF (decoding.banned_outputs)."""
    mean = log_softmax(np.mean([log_softmax(model) for model in logits], axis=0))
    return np.where(decoding.banned_outputs(mean.shape[-1]), decoding.NEG_INF, mean)


def test_an_ensemble_of_two_models_takes_the_argmax_of_their_mean_log_probs(runs):
    """Greedy: each emitted token is the argmax of the mean of the two models' log-probabilities,
    teacher-forced on the ensemble's output; the ensemble's score (translate.py --score) is the
    sum of those of its tokens, and its attention the main model's."""
    def build(ensemble, xs):
        ids, scores = decoding.translate(ensemble, xs, decoding.DecodingSettings(alpha=0.6))
        logits = [ensemble.models[0].teacher_forced(xs, ids)[0]]
        with tf1.variable_scope("ensemble_1", reuse=True):
            logits.append(ensemble.models[1].teacher_forced(xs, ids)[0])
        attention = [ensemble.attention(xs, ids), ensemble.models[0].attention(xs, ids)]
        return ids, scores, logits, ensemble.score(xs, ids, alpha=0.6), attention
    (ids, scores, logits, forced, attention), (_, x_seqlen) = session_of(
        runs["main"], [runs["other"]], build)
    np.testing.assert_array_equal(*attention)  # the main model's, for --plot_attention and serve.py
    assert logits[0].shape[-1] == logits[1].shape[-1]
    log_probs = mean_log_probs(logits)
    steps = np.ceil(1.5 * (x_seqlen - 1) + 10)  # decoding.max_decoding_steps
    # a sentence's last step emits </s> whatever the log-probabilities: left out
    free = (ids != 0) & (np.arange(ids.shape[1])[None, :] + 1 < steps[:, None])
    assert free.sum() > len(SENTENCES)
    np.testing.assert_array_equal(log_probs.argmax(-1)[free], ids[free])
    token_log_probs = np.take_along_axis(log_probs, ids[:, :, None], -1)[:, :, 0]
    lengths = (ids != 0).sum(1)
    expected = (token_log_probs * (ids != 0)).sum(1) / ((5 + lengths) / 6) ** 0.6
    np.testing.assert_allclose(forced, expected, atol=1e-4)
    np.testing.assert_allclose(scores, forced, atol=1e-4)


def run_translate(capsys, *args):
    """translate.py in this process. Returns (exit code, stdout lines, stderr)."""
    code, out, err = run_in_process(capsys, "translate.py", translate.main, *args)
    return code, out.splitlines(), err


def test_translate_py_with_an_ensemble_of_a_logdir_or_a_checkpoint(runs, capsys, tmp_path):
    main, other = runs["main"], runs["other"]
    for member in (other, find_checkpoint(other)):
        code, lines, err = run_translate(capsys, "--logdir", main, "--ensemble", member,
                                         "--beam_size", "2", *SENTENCES)
        assert code == 0 and len(lines) == len(SENTENCES), err
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("\n".join(SENTENCES[:2]) + "\n")
    references.write_text("311\n42\n")
    code, lines, err = run_translate(capsys, "--logdir", main, "--ensemble", other, "--input",
                                     sources, "--score", references)
    assert code == 0 and len(lines) == 2 and all(len(line.split("\t")) == 2 for line in lines), err


def test_a_member_of_another_bpe_model_is_one_line(runs, capsys):
    code, lines, err = run_translate(capsys, "--logdir", runs["main"], "--ensemble",
                                     runs["vocab"], SENTENCES[0])
    assert code == 2 and lines == [] and "Traceback" not in err
    errors = err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: --ensemble %s: " % runs["vocab"])
    assert "bpe.model" in errors[0]


def test_ensemble_refuses_the_ctranslate2_engine_and_a_missing_member(runs, capsys, tmp_path):
    code, _, err = run_translate(capsys, "--engine", "ctranslate2", "--model", tmp_path,
                                 "--ensemble", runs["other"], SENTENCES[0])
    assert code == 2 and "--ensemble decodes with the TensorFlow engine" in err
    missing = os.path.join(str(tmp_path), "nowhere", "model-10")
    code, _, err = run_translate(capsys, "--logdir", runs["main"], "--ensemble", missing,
                                 SENTENCES[0])
    assert code == 2 and err.strip() == ("error: --ensemble %s: no such logdir or checkpoint"
                                         % missing)
