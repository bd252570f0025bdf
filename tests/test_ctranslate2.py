"""ctranslate2_engine.py: our weights converted to CTranslate2 decode as our own decoder does (post- and pre-norm,
several blocks and heads), and int8 export shrinks the model. Skipped when ctranslate2 is not installed."""
import os

import numpy as np
import pytest
import tensorflow as tf

from toolkit.translating import ctranslate2_engine
from decoding import DecodingSettings, translate
from model_fixtures import build, random_ids, small_hp

ctranslate2 = pytest.importorskip("ctranslate2")
tf1 = tf.compat.v1
STEPS = 12  # decoding steps per sentence, the last of which may only give </s>


def pieces(vocab_size):
    return ["<pad>", "<unk>", "<s>", "</s>"] + ["p%d" % i for i in range(4, vocab_size)]


@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_converted_model_decodes_like_our_cached_greedy(norm_type, tmp_path):
    """Random weights, scaled up so that different sources get different translations."""
    rng = np.random.RandomState(7)
    hp = small_hp(num_blocks=2, norm_type=norm_type)
    with tf.Graph().as_default():
        model, ph = build(hp)
        ids_op, _ = translate(model, ph.xs, DecodingSettings(alpha=0.6, max_len_a=0.0, max_len_b=STEPS))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            variables = tf1.global_variables()
            weights = {v.op.name: 3.0 * value for v, value in zip(variables, sess.run(variables))}
            sess.run([v.assign(weights[v.op.name]) for v in variables])
            x = random_ids(rng, [9, 2, 5, 7, 3, 8, 6, 4], hp.vocab_size)
            ours = [[int(i) for i in row if i] for row in sess.run(ids_op, ph.feed(x))]
    spec = ctranslate2_engine.transformer_spec(weights, hp, pieces(hp.vocab_size))
    spec.validate()
    spec.optimize(quantization="float32")
    spec.save(str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", compute_type="float32")
    sources = [[pieces(hp.vocab_size)[i] for i in row if i] for row in x]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=STEPS - 1,
                                         suppress_sequences=[["<pad>"], ["<s>"]], return_end_token=True)
    theirs = [[pieces(hp.vocab_size).index(p) for p in r.hypotheses[0]] for r in results]
    theirs = [ids if ids[-1] == 3 else ids + [3] for ids in theirs]  # at the limit ours gives </s>
    assert len({tuple(ids) for ids in ours}) >= 4, ours  # a comparison that can tell sentences apart
    assert theirs == ours


def test_int8_export_shrinks_the_model(tmp_path):
    """int8 linear weights; the position table, biases and layer norms stay float32."""
    hp = small_hp(vocab_size=40, d_model=64, d_ff=256)
    with tf.Graph().as_default():
        model, ph = build(hp)
        translate(model, ph.xs, DecodingSettings())  # creates every variable
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            variables = tf1.global_variables()
            weights = {v.op.name: value for v, value in zip(variables, sess.run(variables))}
    sizes = {}
    for quantization in ("float32", "int8"):
        spec = ctranslate2_engine.transformer_spec(weights, hp, pieces(hp.vocab_size))
        spec.validate()
        spec.optimize(quantization=quantization)
        os.makedirs(tmp_path / quantization)
        spec.save(str(tmp_path / quantization))
        sizes[quantization] = os.path.getsize(tmp_path / quantization / "model.bin")
    assert sizes["int8"] < 0.5 * sizes["float32"], sizes
