"""export.py and scripts/serve_example.py: a SavedModel that a program without this project's code serves, and
that translates exactly as test.py does."""
import ast
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import export
import test as test_cli
from toolkit.base.errors import UserError
from toolkit.base.reading import read_lines

tf1 = tf.compat.v1
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE_EXAMPLE = os.path.join(REPO_ROOT, "scripts", "serve_example.py")
DECODING = ["--beam_size", "2", "--alpha", "0.6"]


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """(root, data_dir, logdir): the session's tiny model (conftest.py) and a directory for what the tests write."""
    logdir, data_dir = tiny_model
    return tmp_path_factory.mktemp("export"), data_dir, logdir


@pytest.fixture(scope="module")
def export_dir(trained):
    root, _, logdir = trained
    path = str(root / "export")
    assert export.main(["--logdir", logdir, "--export_dir", path] + DECODING) == 0
    return path


def test_serve_example_prints_what_test_py_translates(trained, export_dir):
    root, data_dir, logdir = trained
    assert test_cli.main(["--logdir", logdir, "--testdir", str(root / "test")] + DECODING) == 0
    hypotheses = read_lines(str(root / "test" / "hypotheses.txt"))
    assert len(set(hypotheses)) >= 3, hypotheses  # a comparison that can tell sentences apart
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    served = subprocess.run([sys.executable, SERVE_EXAMPLE, export_dir] + read_lines(os.path.join(data_dir, "test.1")),
                            capture_output=True, text=True, cwd=str(root), env=env, timeout=300)
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.splitlines() == hypotheses


def test_serve_example_imports_only_tensorflow_and_sentencepiece():
    with open(SERVE_EXAMPLE, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert imported <= {"sys", "os", "json", "tensorflow", "sentencepiece"}, imported


def test_saved_model_signature_and_sentencepiece_asset(trained, export_dir):
    _, data_dir, _ = trained
    assert os.listdir(os.path.join(export_dir, "assets")) == ["bpe.model"]
    with open(os.path.join(export_dir, "assets", "bpe.model"), "rb") as exported, \
            open(os.path.join(data_dir, "bpe.model"), "rb") as original:
        assert exported.read() == original.read()

    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "bpe.model"))
    sources = [ids + [3] for ids in sp.encode(read_lines(os.path.join(data_dir, "test.1"))[:3])]
    src_ids = np.zeros([3, max(map(len, sources))], np.int32)
    for row, ids in zip(src_ids, sources):
        row[:len(ids)] = ids
    with tf.Graph().as_default() as graph, tf1.Session() as sess:
        meta_graph = tf1.saved_model.loader.load(sess, [tf1.saved_model.tag_constants.SERVING], export_dir)
        signature = meta_graph.signature_def["serving_default"]

        def specs(tensors):
            return {name: (tf.as_dtype(info.dtype), [dim.size for dim in info.tensor_shape.dim])
                    for name, info in tensors.items()}
        assert specs(signature.inputs) == {"src_ids": (tf.int32, [-1, -1])}
        assert specs(signature.outputs) == {"ids": (tf.int32, [-1, -1]), "scores": (tf.float32, [-1]),
                                            "log_probs": (tf.float32, [-1]), "confidence": (tf.float32, [-1])}
        ids, scores, log_probs, confidence = sess.run(
            [graph.get_tensor_by_name(signature.outputs[name].name) for name in ("ids", "scores", "log_probs", "confidence")],
            {graph.get_tensor_by_name(signature.inputs["src_ids"].name): src_ids})
    assert scores.shape == (3,) and np.all(scores < 0)
    for row in ids.tolist():
        assert 3 in row and not any(row[row.index(3) + 1:]), row  # ends in </s>, then 0s
    lengths = (ids != 0).sum(1)
    # beam 2, alpha 0.6: the score is the log-probability over the length penalty
    np.testing.assert_allclose(scores, log_probs / ((5 + lengths) / 6) ** 0.6, rtol=1e-5)
    np.testing.assert_allclose(confidence, np.exp(log_probs / lengths), rtol=1e-5)
    assert np.all((0 < confidence) & (confidence <= 1))


def test_a_saved_model_keeps_the_numeric_decoding_options_given_at_export(trained):
    """--min_len_b and --no_repeat_ngram_size are fixed in the graph: every output is at least that
    long and repeats no bigram, where the same model without them stops earlier or repeats."""
    root, data_dir, logdir = trained
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "bpe.model"))
    sources = [ids + [3] for ids in sp.encode(read_lines(os.path.join(data_dir, "test.1"))[:8])]
    src_ids = np.zeros([len(sources), max(map(len, sources))], np.int32)
    for row, ids in zip(src_ids, sources):
        row[:len(ids)] = ids
    outputs = {}
    for name, flags in (("plain", []), ("options", ["--min_len_b", "12", "--no_repeat_ngram_size", "2"])):
        path = str(root / ("export-" + name))
        assert export.main(["--logdir", logdir, "--export_dir", path, "--max_len_b", "30"] + flags) == 0
        with tf.Graph().as_default() as graph, tf1.Session() as sess:
            signature = tf1.saved_model.loader.load(sess, [tf1.saved_model.tag_constants.SERVING],
                                                    path).signature_def["serving_default"]
            outputs[name] = sess.run(graph.get_tensor_by_name(signature.outputs["ids"].name),
                                     {graph.get_tensor_by_name(signature.inputs["src_ids"].name): src_ids})
    plain_lengths = [row.tolist().index(3) for row in outputs["plain"]]
    assert min(plain_lengths) < 12, plain_lengths  # the minimum has something to do
    for row in outputs["options"].tolist():
        tokens = row[:row.index(3)]
        assert len(tokens) >= 12, row
        bigrams = list(zip(tokens, tokens[1:]))
        assert len(bigrams) == len(set(bigrams)), row


def test_export_refuses_decoding_options_for_a_ctranslate2_model(trained, tmp_path):
    _, _, logdir = trained
    with pytest.raises(UserError, match="--sampling_topk is fixed in a SavedModel only"):
        export.main(["--logdir", logdir, "--export_dir", str(tmp_path / "ct2"), "--format", "ctranslate2",
                     "--sampling_topk", "5"])


def test_export_refuses_a_non_empty_export_dir(trained, export_dir):
    _, _, logdir = trained
    with pytest.raises(UserError, match="--export_dir .* already exists and is not empty"):
        export.main(["--logdir", logdir, "--export_dir", export_dir])


def test_export_of_a_missing_checkpoint(trained, tmp_path):
    _, _, logdir = trained
    with pytest.raises(UserError, match="checkpoint .*nope-1 not found; checkpoints in .*: .*%s$"
                       % re.escape(tf.train.latest_checkpoint(logdir))):
        export.main(["--logdir", logdir, "--export_dir", str(tmp_path / "x"), "--ckpt", logdir + "/nope-1"])
    assert not os.path.exists(tmp_path / "x")
