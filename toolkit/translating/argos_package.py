"""A trained model as an Argos Translate package (.argosmodel), which LibreTranslate serves.

export.py --format argos calls export(). The package is a zip of one folder:

    translate-SRC_TGT-VERSION/
      metadata.json        what argostranslate reads: languages, their names, type, versions
      model/               the CTranslate2 model (ctranslate2_engine's conversion), appending </s>
                           to each source itself (config.json: add_source_eos): Argos does not
      sentencepiece.model  the data dir's sentencepiece model; Argos would read a bpe.model as
                           subword-nmt codes, so the name matters
      spacy/               a blank spaCy pipeline of the source language, for Argos's rule-based
                           sentence splitting with ARGOS_CHUNK_TYPE=SPACY (docs/serving.md: why)
      README.md            the checkpoint, and the decoding settings the toolkit uses for it

Argos decodes every package alike (ARGOS_BEAM_SIZE, length penalty 0.2, at most 256 pieces): a
package cannot carry settings of its own, so its README states the toolkit's.
"""
import json
import os
import shutil
import zipfile

import numpy as np

from toolkit.translating import ctranslate2_engine
from toolkit.base.errors import UserError, writing
from toolkit.base.writing import check_writable_file, write_json
from toolkit.base.writing import PATH_NAME, check_path_name, publish, staging_dir
from toolkit.version import __version__

#: The argos_version field: the package layout of Argos Translate 1.9 and later, which this follows.
ARGOS_VERSION = "1.9"
#: Names of the language codes the metadata gets without --from_name / --to_name (ISO 639-1).
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
                  "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
                  "zh": "Chinese"}
#: Added to the logits of <pad> and <s> (ids NEVER_IDS) in the package's output layer: Argos cannot
#: ask CTranslate2 to suppress them, and the toolkit's decoders never output them.
NEVER = -1e4
NEVER_IDS = (0, 2)


def add_flags(parser):
    """export.py's flags for --format argos: the languages, when the data dir does not name them."""
    group = parser.add_argument_group("--format argos (an Argos Translate package)")
    for side, which in (("from", "source"), ("to", "target")):
        group.add_argument("--%s_code" % side, help="the %s language's code; default the data "
                                                    "dir's (prepro.py --src_lang / --tgt_lang)"
                                                     % which)
        group.add_argument("--%s_name" % side, help="the %s language's name, e.g. German; default "
                                                    "the name of a common code" % which)


def check_flags(args):
    """Raises UserError for a language flag without --format argos, or, with it, an --export_dir
    that can not be a new .argosmodel file."""
    flags = ("from_code", "from_name", "to_code", "to_name")
    given = [flag for flag in flags if getattr(args, flag)]
    if given and args.format != "argos":
        raise UserError("--%s applies to --format argos only" % given[0])
    if args.format == "argos":
        for flag in ("from_code", "to_code"):
            if getattr(args, flag) is not None:
                check_path_name(getattr(args, flag), flag, "a language code")
        check_output(args.export_dir)


def check_output(path):
    """Raises UserError unless path can be a new .argosmodel file."""
    if not path.endswith(".argosmodel"):
        raise UserError("--export_dir %s: with --format argos it names the package file to write, "
                        "which must end in .argosmodel" % path)
    if os.path.exists(path):
        raise UserError("--export_dir %s already exists: remove it or choose another" % path)
    check_writable_file(path, "export_dir")


def languages(args, manifest):
    """{from_code, from_name, to_code, to_name}: the flags given, else the data dir's manifest
    and LANGUAGE_NAMES."""
    found = {"from_code": args.from_code or manifest.get("src_lang"),
             "to_code": args.to_code or manifest.get("tgt_lang")}
    for side, which in (("from", "source"), ("to", "target")):
        code = found[side + "_code"]
        if not code:
            raise UserError("the data dir's manifest names no %s language: pass --%s_code"
                            % (which, side))
        # the manifest's code names the package's folder too
        if not (isinstance(code, str) and PATH_NAME.fullmatch(code)):
            raise UserError("the data dir's manifest names the %s language %s, which is no code "
                            "of ASCII letters, digits, '-' and '_' (it becomes part of a path): "
                            "pass --%s_code" % (which, ascii(code), side))
        name = getattr(args, side + "_name") or LANGUAGE_NAMES.get(code)
        if not name:
            raise UserError("no name known for the language code %s: pass --%s_name" % (code, side))
        found[side + "_name"] = name
    return found


def metadata(langs):
    """metadata.json: the fields argostranslate reads for a translation package."""
    return {"package_version": __version__, "argos_version": ARGOS_VERSION, "type": "translate",
            **langs, "links": []}


def package_name(langs):
    """The package folder's name, as argospm names packages: translate-de_en-2_4_0."""
    return "translate-%s_%s-%s" % (langs["from_code"], langs["to_code"],
                                   __version__.replace(".", "_"))


def write_model(weights, hp, bpe_model, model_dir, quantization):
    """The CTranslate2 model Argos loads: ctranslate2_engine's conversion, appending </s> to each
    source itself and never giving <pad> or <s>."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=bpe_model)
    pieces = [sp.id_to_piece(i) for i in range(hp.vocab_size)]
    spec = ctranslate2_engine.transformer_spec(weights, hp, pieces)
    bias = np.zeros(hp.vocab_size, np.float32)
    bias[list(NEVER_IDS)] = NEVER
    spec.decoder.projection.bias = bias
    spec.config.add_source_eos = True
    spec.validate()
    spec.optimize(quantization=quantization)
    os.makedirs(model_dir)
    spec.save(model_dir)


def blank_pipeline(code):
    """A blank spaCy pipeline with the tokenizer rules of language `code` (spaCy's multilingual
    'xx' for a code it has none for); nothing is downloaded."""
    try:
        import spacy
    except ImportError:
        raise UserError("--format argos needs spaCy for the package's sentence splitting: pip "
                        "install -r requirements.txt") from None
    try:
        return spacy.blank(code)
    except ImportError:  # spaCy has no language data for the code
        return spacy.blank("xx")


def readme(langs, hp, ckpt, quantization):
    """The package's README.md: its model, and the toolkit's decoding settings, which Argos does
    not read."""
    return "\n".join([
        "# %s -> %s" % (langs["from_name"], langs["to_name"]),
        "",
        "Transformer NMT toolkit %s: checkpoint %s, %d blocks of d_model %d, weights in %s."
        % (__version__, os.path.basename(ckpt), hp.num_blocks, hp.d_model, quantization),
        "The toolkit decodes it with beam %d and length penalty ((5 + length) / 6)^%g; Argos "
        "Translate with ARGOS_BEAM_SIZE (default 4) and CTranslate2's length^0.2."
        % (hp.beam_size, hp.alpha),
        "Sentences are split by spaCy's rule-based sentencizer over the blank pipeline in spacy/: "
        "run Argos with ARGOS_CHUNK_TYPE=SPACY.",
        ""])


def zip_folder(folder, path):
    """Writes the zip file path holding folder (its own name the top of every entry)."""
    top = os.path.dirname(folder)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for directory, _, files in sorted(os.walk(folder)):
            for name in sorted(files):
                full = os.path.join(directory, name)
                archive.write(full, os.path.relpath(full, top))


def write_package(weights, hp, bpe_model, path, quantization, langs, ckpt):
    """Writes the .argosmodel file path: built in a staging directory beside it, zipped, and renamed
    into place, so that an interrupted export leaves no half-written package."""
    with staging_dir(os.path.dirname(os.path.abspath(path)), ".tmp-argos-") as tmp:
        root = os.path.join(tmp, package_name(langs))
        write_model(weights, hp, bpe_model, os.path.join(root, "model"), quantization)
        shutil.copyfile(bpe_model, os.path.join(root, "sentencepiece.model"))
        blank_pipeline(langs["from_code"]).to_disk(os.path.join(root, "spacy"))
        write_json(os.path.join(root, "metadata.json"), metadata(langs))
        with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
            f.write(readme(langs, hp, ckpt, quantization))
        zip_folder(root, os.path.join(tmp, "package.argosmodel"))
        # what appeared at path meanwhile: refused, not replaced
        publish(os.path.join(tmp, "package.argosmodel"), path, "export_dir")


def export(args, hp, manifest, ckpt, bpe_model):
    """export.py --format argos: the checkpoint ckpt as the package args.export_dir."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("--format argos needs the ctranslate2 package: pip install -r "
                        "requirements.txt") from None
    from toolkit.training.logdir import pinned_checkpoint
    langs = languages(args, manifest)
    with pinned_checkpoint(ckpt) as path:  # training may rotate ckpt away meanwhile
        weights = ctranslate2_engine.checkpoint_weights(path)
    with writing(args.export_dir):
        write_package(weights, hp, bpe_model, args.export_dir, args.quantization, langs, ckpt)
    print("exported %s (%s, %s -> %s) to %s; install it with "
          "argostranslate.package.install_from_path and serve it with LibreTranslate "
          "(docs/serving.md)" % (os.path.basename(ckpt), args.quantization, langs["from_code"],
                                 langs["to_code"], args.export_dir))


def write_offline_cache(cache_home):
    """Puts a blank multilingual spaCy pipeline where argostranslate caches spaCy's xx_sent_ud_sm
    (CACHE_HOME/argos-translate/spacy, with the senter/model folder it looks for). With
    ARGOS_CHUNK_TYPE=SPACY, importing argostranslate downloads that model unless it finds one
    there; with this it downloads nothing, and a package without a spacy/ folder of its own is
    split by the same rule-based sentencizer. Returns the folder."""
    folder = os.path.join(cache_home, "argos-translate", "spacy")
    os.makedirs(os.path.join(folder, "senter", "model"), exist_ok=True)
    blank_pipeline("xx").to_disk(folder)
    return folder


def read_metadata(path):
    """The metadata.json of an .argosmodel file."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist()
                    if n.count("/") == 1 and n.endswith("/metadata.json"))
        return json.loads(archive.read(name))


def main(argv=None):
    """python -m toolkit.translating.argos_package [--cache_home DIR]: write_offline_cache."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.translating.argos_package",
        description="Fill argostranslate's spaCy cache with a blank pipeline, so that with "
                    "ARGOS_CHUNK_TYPE=SPACY it downloads no sentence splitter. Run it once before "
                    "LibreTranslate first starts, with the XDG_CACHE_HOME it will have.")
    parser.add_argument("--cache_home", default=os.environ.get("XDG_CACHE_HOME")
                        or os.path.expanduser("~/.local/cache"),
                        help="argostranslate's cache root: $XDG_CACHE_HOME, else ~/.local/cache "
                             "(argostranslate's default)")
    folder = write_offline_cache(parser.parse_args(argv).cache_home)
    print("wrote a blank spaCy pipeline to %s: with ARGOS_CHUNK_TYPE=SPACY argostranslate "
          "downloads no sentence splitter" % folder)
    return 0


if __name__ == "__main__":
    from toolkit.base.cli import run_cli
    run_cli(main)
