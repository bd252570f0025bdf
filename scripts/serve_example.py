"""Translates sentences with a SavedModel written by export.py, using only tensorflow and sentencepiece.

    python scripts/serve_example.py EXPORT_DIR "first sentence" "second sentence" ...
"""
import sys

import sentencepiece as spm
import tensorflow as tf


def translate(export_dir, sentences):
    """Returns the translation of each sentence (a list of str)."""
    model = tf.saved_model.load(export_dir)
    bpe_model = model.asset_paths[0].asset_path.numpy().decode()  # EXPORT_DIR/assets/bpe.model
    sp = spm.SentencePieceProcessor(model_file=bpe_model)
    eos = sp.eos_id()  # 3; <pad> is 0
    sources = [ids + [eos] for ids in sp.encode(sentences)]
    width = max(len(ids) for ids in sources)
    src_ids = tf.constant([ids + [0] * (width - len(ids)) for ids in sources], tf.int32)
    outputs = model.signatures["serving_default"](src_ids=src_ids)
    return [sp.decode(ids[:ids.index(eos)]) for ids in outputs["ids"].numpy().tolist()]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for translation in translate(sys.argv[1], sys.argv[2:]):
        print(translation)
