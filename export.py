"""Exports a trained model, with its sentencepiece model, as a SavedModel that translates batches of
token ids (the default) or as a CTranslate2 model directory.

    python export.py --logdir runs/numbers --export_dir export/numbers [--ckpt PATH|best] \\
        [--beam_size 4 --alpha 0.6]
    python export.py --logdir runs/numbers --export_dir ct2/numbers --format ctranslate2 \\
        [--quantization int8]
    python export.py --logdir runs/numbers --export_dir de_en.argosmodel --format argos \\
        [--quantization int8]

Signature serving_default:
    input   src_ids  int32 (N, T)    sentencepiece ids of each source sentence followed by </s> (3),
                                     padded with 0
    output  ids      int32 (N, T')   the translations' ids, each ending in </s> (3) and
                                     padded with 0
            scores   float32 (N,)    log p(ids | src) / ((5 + length) / 6)^alpha
            log_probs  float32 (N,)  log p(ids | src), </s> included
            confidence float32 (N,)  exp(log_probs / tokens): the geometric mean of the
                                     translation's token probabilities
Beam size, alpha and the length limit (max_len_a * source length + max_len_b) are fixed at export;
by default they are those of LOGDIR/hparams.json, as for test.py. So are the numeric decoding
options (--min_len_a, --min_len_b, --sampling_topk, --sampling_topp, --sampling_temperature,
--no_repeat_ngram_size, --repetition_penalty; off by default; see docs/decoding.md). The data
dir's sentencepiece model is the SavedModel's only asset (EXPORT_DIR/assets/bpe.model);
scripts/serve_example.py translates text with tensorflow and sentencepiece alone.

--format ctranslate2 writes CTranslate2's files (weights in float32, or quantized to int8 or int16),
bpe.model, and translate.json (the decoding settings and the model's source length limit) for
`translate.py --engine ctranslate2 --model EXPORT_DIR`; see
toolkit/translating/ctranslate2_engine.py.

--format argos writes the .argosmodel file EXPORT_DIR, an Argos Translate package that
LibreTranslate serves; see toolkit/translating/argos_package.py and docs/serving.md.
"""
import os

from toolkit.base import runtime  # first: TensorFlow's environment defaults

import contextlib
import shlex

import tensorflow as tf

import decoding
from data_load import Sources
from hparams import TRAINED_FLAGS_HINT, add_decoding_options
from toolkit.translating import argos_package, ctranslate2_engine
from toolkit.base.cli import OneLineParser, run_cli
from toolkit.base.errors import UserError, writing
from toolkit.base.ids import PAD_ID
from toolkit.training.logdir import pinned_checkpoint
from toolkit.base.writing import check_writable_dir
from toolkit.base.writing import publish, staging_dir
from toolkit.translating.trained_model import TrainedModel, trained_hparams

tf1 = tf.compat.v1

#: The decoding options a SavedModel fixes at export: the numbers (a prefix and an ensemble
#: are not).
EXPORTED_OPTIONS = ("min_len_a", "min_len_b", "sampling_topk", "sampling_topp",
                    "sampling_temperature", "no_repeat_ngram_size", "repetition_penalty")
#: The flags of export.py that, when given, override the values in LOGDIR/hparams.json.
TRAINED_OVERRIDES = ("data_dir", "beam_size", "alpha", "max_len_a", "max_len_b") \
    + EXPORTED_OPTIONS


def build_parser():
    """The command line of export.py."""
    parser = OneLineParser(prog="export.py",
                           description="Export a trained model as a SavedModel (signature "
                                       "serving_default: src_ids -> ids, scores) with its "
                                       "sentencepiece model among the assets.",
                           unrecognized_hint=TRAINED_FLAGS_HINT)
    parser.add_argument("--logdir", required=True, help="a logdir written by train.py")
    parser.add_argument("--export_dir", required=True,
                        help="where to write the SavedModel; must not exist yet")
    parser.add_argument("--ckpt", default="",
                        help="checkpoint to export; default the latest in --logdir; best: the best "
                             "by dev BLEU (LOGDIR/best.json)")
    parser.add_argument("--data_dir",
                        help="data dir with the model's bpe.model; default the one in hparams.json")
    parser.add_argument("--beam_size", type=int,
                        help="beam width, 1 is greedy; default from hparams.json")
    parser.add_argument("--alpha", type=float,
                        help="length penalty ((5+len)/6)^alpha; default from hparams.json")
    parser.add_argument("--max_len_a", type=float,
                        help="decode at most max_len_a * source length + max_len_b steps; default "
                             "from hparams.json")
    parser.add_argument("--max_len_b", type=int, help="see --max_len_a; default from hparams.json")
    parser.add_argument("--format", choices=["savedmodel", "ctranslate2", "argos"],
                        default="savedmodel",
                        help="savedmodel (default): a TensorFlow SavedModel; ctranslate2: a "
                             "CTranslate2 model directory for translate.py --engine ctranslate2 "
                             "(needs the ctranslate2 package); argos: an Argos Translate package "
                             "for LibreTranslate, --export_dir naming the .argosmodel file (needs "
                             "ctranslate2 and spacy)")
    parser.add_argument("--quantization", choices=["float32", "int8", "int16"],
                        help="weight type of --format ctranslate2 or argos (default float32); the "
                             "SavedModel is float32")
    add_decoding_options(parser.add_argument_group(
        "decoding options of the SavedModel (see docs/decoding.md)"), EXPORTED_OPTIONS)
    argos_package.add_flags(parser)
    return parser


def parse_args(argv):
    """The flags, and the model's hyperparameters: LOGDIR/hparams.json with the decoding flags given
    on top."""
    args = build_parser().parse_args(argv)
    if args.quantization and args.format == "savedmodel":
        raise UserError("--quantization %s applies to --format ctranslate2 or argos only: the "
                        "SavedModel holds the float32 weights; add --format ctranslate2, or leave "
                        "--quantization out" % args.quantization)
    argos_package.check_flags(args)
    given = [option for option in EXPORTED_OPTIONS
             if getattr(args, option) != decoding.OPTION_DEFAULTS[option]]
    if given and args.format != "savedmodel":
        raise UserError("--%s is fixed in a SavedModel only: a %s model takes it when it "
                        "translates (translate.py or serve.py --%s); leave it out here"
                        % (given[0], args.format, given[0]))
    args.quantization = args.quantization or "float32"
    hp = trained_hparams(args.logdir, {flag: getattr(args, flag) for flag in TRAINED_OVERRIDES
                                       if getattr(args, flag) is not None})
    if args.format == "argos":
        return args, hp  # export_dir is a file, which argos_package.check_flags checked
    check_writable_dir(args.export_dir, "export_dir")
    if os.path.exists(args.export_dir) and os.listdir(args.export_dir):
        raise UserError("--export_dir %s already exists and is not empty: remove it "
                        "or choose another" % args.export_dir)
    return args, hp


def build_translator(trained):
    """Translation graph over a src_ids placeholder (N, T), in the default graph.

    Returns the signature's inputs {"src_ids"} and outputs {"ids" (N, T'), "scores" (N,),
    "log_probs" (N,), "confidence" (N,)}.
    """
    src_ids = tf1.placeholder(tf.int32, [None, None], name="src_ids")
    # (N,), counts </s>
    x_seqlen = tf.reduce_sum(tf.cast(tf.not_equal(src_ids, PAD_ID), tf.int32), axis=1)
    xs = Sources(src_ids, x_seqlen)
    ids, scores, log_probs = (t[:, 0] for t in decoding.search(
        trained.build(), xs, decoding.DecodingSettings.from_flags(trained.hp)))
    tokens = tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.float32), axis=1)
    return {"src_ids": src_ids}, {"ids": tf.identity(ids, name="ids"),
                                  "scores": tf.identity(scores, name="scores"),
                                  "log_probs": tf.identity(log_probs, name="log_probs"),
                                  "confidence": tf.exp(log_probs / tokens, name="confidence")}


def save_model(sess, export_dir, inputs, outputs, asset):
    """Writes the session's graph and variables as a SavedModel (tag serve) with a serving_default
    signature and the file asset copied into EXPORT_DIR/assets. Writes to a temporary directory
    first, so that an interrupted export leaves no half-written export_dir."""
    tf1.add_to_collection(tf1.GraphKeys.ASSET_FILEPATHS, tf.constant(asset, name="bpe_model_path"))
    signature = tf1.saved_model.signature_def_utils.predict_signature_def(inputs, outputs)
    with export_staging(export_dir) as tmp:
        builder = tf1.saved_model.Builder(os.path.join(tmp, "model"))
        serving_key = tf1.saved_model.signature_constants.DEFAULT_SERVING_SIGNATURE_DEF_KEY
        builder.add_meta_graph_and_variables(
            sess, [tf1.saved_model.tag_constants.SERVING],
            signature_def_map={serving_key: signature},
            assets_collection=tf1.get_collection(tf1.GraphKeys.ASSET_FILEPATHS),
            strip_default_attrs=True)
        builder.save()
        # a link to a directory: followed; what appeared there meanwhile: refused
        publish(os.path.join(tmp, "model"), export_dir, "export_dir")


@contextlib.contextmanager
def export_staging(export_dir):
    """The staging directory of an export, beside export_dir (toolkit.base.writing.staging_dir:
    those of killed exports are removed first); a full disk is a line naming export_dir and its
    free space."""
    parent = os.path.dirname(os.path.realpath(export_dir))
    os.makedirs(parent, exist_ok=True)
    with writing(export_dir), staging_dir(parent, ".tmp-export-") as tmp:
        yield tmp


def export_ctranslate2(hp, ckpt, bpe_model, export_dir, quantization, manifest):
    """Writes the checkpoint ckpt as a CTranslate2 model directory, through a temporary directory
    renamed into place; its settings keep the data dir's languages (manifest), which
    serve.py names."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("--format ctranslate2 needs the ctranslate2 package: "
                        "pip install -r requirements.txt") from None
    settings = {flag: getattr(hp, flag) for flag
                in ("beam_size", "alpha", "max_len_a", "max_len_b", "maxlen1")}
    settings.update(quantization=quantization, checkpoint=os.path.basename(ckpt),
                    **{key: manifest[key] for key in ("src_lang", "tgt_lang") if key in manifest})
    with export_staging(export_dir) as tmp:
        with pinned_checkpoint(ckpt) as path:  # training may rotate ckpt away meanwhile
            weights = ctranslate2_engine.checkpoint_weights(path)
        ctranslate2_engine.write_model(weights, hp, bpe_model, os.path.join(tmp, "model"),
                                       quantization, settings)
        # a link to a directory: followed; what appeared there meanwhile: refused
        publish(os.path.join(tmp, "model"), export_dir, "export_dir")
    return ckpt


def main(argv=None):
    runtime.start_graph_mode()
    args, hp = parse_args(argv)
    trained = TrainedModel(hp, args.ckpt)
    ckpt, bpe_model = trained.ckpt, trained.bpe_model
    if args.format == "ctranslate2":
        export_ctranslate2(hp, ckpt, bpe_model, args.export_dir, args.quantization,
                           trained.manifest)
        print("exported %s (%s) to %s; try: python translate.py --engine ctranslate2 --model %s "
              "\"a sentence\"" % (os.path.basename(ckpt), args.quantization, args.export_dir,
                                  shlex.quote(args.export_dir)))
        return 0
    if args.format == "argos":
        argos_package.export(args, hp, trained.manifest, ckpt, bpe_model)
        return 0
    inputs, outputs = build_translator(trained)
    with trained.session() as sess:
        ckpt = trained.ckpt
        save_model(sess, args.export_dir, inputs, outputs, bpe_model)
    print("exported %s (beam %d, alpha %g) to %s; try: python scripts/serve_example.py %s "
          "\"a sentence\""
          % (os.path.basename(ckpt), hp.beam_size, hp.alpha, args.export_dir,
             shlex.quote(args.export_dir)))
    return 0


if __name__ == "__main__":
    run_cli(main)
