"""The model behind serve.py's API: its translator in a Batcher, its sentencepiece model and
languages, the limits of a request, and how a request's fields become the model's inputs and its
results the answer's fields; the suggestions and the translation memory (SQLite stores), and a new
model loaded in the background and swapped in. Every refusal is an ApiError with its
HTTP status."""
import asyncio
import concurrent.futures
import dataclasses
import functools
import hmac
import os
import sqlite3

from langdetect import DetectorFactory, detect_langs
from langdetect.lang_detect_exception import LangDetectException
import tensorflow as tf

from hparams import DECODING_OPTIONS, RANGES
from toolkit.base.errors import UserError
from toolkit.data import datadir
from toolkit.translating import documents
from toolkit.serving.batcher import ApiError, Batcher
from toolkit.translating.documents import Document
from toolkit.serving.requests import in_range, real_number, whole_number
from toolkit.base.ids import PAD_ID
from toolkit.translating.sentences import (line_prefixes, prefix_ids, prepare,
                                           translation_entries)
from toolkit.serving.suggestions import Store
from toolkit.training.logdir import check_not_rejected
from toolkit.translating.documents import Entry
from toolkit.translating.trained_model import TrainedModel, trained_hparams
from toolkit.translating.translator import Translator, ctranslate2_translator


#: Threads that do the CPU work of requests (HTML parsing, sentence splitting, sentencepiece,
#: language detection) off the event loop, so that a long request delays no other client.
CPU_THREADS = 2


class Service:
    """The model behind the server (its translator in a Batcher, sentencepiece, languages), the
    limits, the threads of the requests' CPU work, the Stores of --suggestions and --memory, and
    the thread that loads a model to swap in."""

    def __init__(self, hp, args):
        # the databases first: a corrupt or locked one is one line before the model loads
        self.suggestions, self.memory = open_stores(args)
        translator, self.sp, recorded, name, self.vocabulary = open_translator(
            hp, args.engine, args.model)
        # the logdir served now (SIGHUP reloads it); none on the ctranslate2 engine
        self.hp, self.logdir = hp, getattr(hp, "logdir", "")
        # the languages prepro.py recorded (--src_lang, --tgt_lang), or its defaults
        self.source_lang, self.target_lang = datadir.languages(recorded)
        self.engine = args.engine
        # each sentence of a paragraph translated alone, unless --no_split
        self.split = None if args.no_split else functools.partial(documents.split,
                                                                  lang=self.source_lang)
        self.limit, self.beam_size, self.args = hp.maxlen1 - 1, hp.beam_size, args
        # the server's decoding flags: a request's fields go on top (min_confidence apart)
        self.settings = dataclasses.replace(translator.settings, min_confidence=0.0)
        self.key = os.fsencode(args.api_key)  # the bytes given on the command line
        # a request for more alternatives than the flags' beam has decodes under a wider beam
        self.most_alternatives = max(args.max_alternatives, hp.beam_size - 1)
        self.batcher = Batcher(translator, hp.test_batch_size, args.batch_wait_ms / 1000,
                               args.queue_size, args.timeout, name)
        self.cpu = concurrent.futures.ThreadPoolExecutor(CPU_THREADS, "requests")
        # one model loaded at a time, beside the requests' threads
        self.loader = concurrent.futures.ThreadPoolExecutor(1, "reload")
        warm_up()
        if self.split:
            self.split("Loads the sentencizer now. Not in the first request.")

    def close(self):
        self.cpu.shutdown()
        self.loader.shutdown()
        self.batcher.stop()
        self.batcher.translator.close()
        for store in {self.suggestions, self.memory} - {None}:
            store.close()

    def check_key(self, fields):
        given = fields.get("api_key", "")
        # compared as bytes: compare_digest takes ASCII strings only; a lone surrogate a client
        # sends encodes to bytes that no key's UTF-8 has
        if self.key and not (isinstance(given, str) and hmac.compare_digest(
                given.encode("utf-8", "surrogatepass"), self.key)):
            raise ApiError(403, "Invalid API key: pass the api_key field this server was started "
                                "with")

    def check_admin_key(self, fields):
        """The admin requests need --api_key (a 403 without it) and the right api_key."""
        if not self.key:
            raise ApiError(403, "Admin requests are disabled: start serve.py with --api_key to "
                                "allow them")
        self.check_key(fields)

    def items(self, fields):
        """The q items of a request (a list of strings), checked against the limits."""
        q = fields.get("q")
        if not q:
            raise ApiError(400, "Invalid request: missing q parameter (a string or a list of "
                                "strings)")
        items = [q] if isinstance(q, str) else q
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ApiError(400, "Invalid request: q must be a string or a list of strings")
        chars = max(len(item) for item in items)
        if chars > self.args.char_limit:
            raise ApiError(400, "Invalid request: a q item has %d characters, more than this "
                                "server's limit of %d (--char_limit): send less text per item"
                           % (chars, self.args.char_limit))
        return items

    def check_languages(self, fields, auto=True):
        """A 400 unless source is the model's source language (or auto, when allowed) and target
        its target language."""
        source, target = fields.get("source"), fields.get("target")
        if source not in (self.source_lang, "auto" if auto else self.source_lang):
            raise ApiError(400, "%s is not supported: this model translates from %s%s"
                                % (language_field("source", source), self.source_lang,
                                   " (or pass auto)" if auto else ""))
        if target != self.target_lang:
            raise ApiError(400, "%s is not supported: this model translates into %s"
                                % (language_field("target", target), self.target_lang))

    def suggestion(self, fields):
        """(q, s, source, target) of a /suggest request: each a string given, in LibreTranslate's
        order (its message for a missing one), q and s within --char_limit, and the languages
        of the model."""
        for name in ("q", "s", "source", "target"):
            if not fields.get(name):
                raise ApiError(400, "Invalid request: missing %s parameter" % name)
            if not isinstance(fields[name], str):
                raise ApiError(400, "Invalid request: %s must be a string" % name)
        for name in ("q", "s"):
            if len(fields[name]) > self.args.char_limit:
                raise ApiError(400, "Invalid request: %s has %d characters, more than this "
                                    "server's limit of %d (--char_limit): send less text"
                               % (name, len(fields[name]), self.args.char_limit))
        self.check_languages(fields, auto=False)
        return fields["q"], fields["s"], fields["source"], fields["target"]

    async def suggest(self, q, s, fields):
        """Stores the suggestion s for q, with the model serving now and its translation of q:
        the request's translation field (what the page showed), else the model's now."""
        shown_text = fields.get("translation")
        if isinstance(shown_text, str):
            translation, model = shown_text, self.batcher.model.name
        else:
            translation, model = await self.model_translation(q)
        await self.off_loop(stored, self.suggestions.suggest, q, s, self.source_lang,
                            self.target_lang, model, translation)

    async def model_translation(self, q):
        """(translation, model name): q translated as /translate translates it with the server's
        settings, and the name of the model that did."""
        documents, parts, _, _ = await self.off_loop(self.prepare, [q], "text")
        sources = [source for segment in parts[0] for source in segment]
        results, model = await self.batcher.translate_named(sources, False)
        entries, _ = read_results(documents, parts, results, self.sp)
        return entries[0][0].text, model

    async def recall(self, items, fmt, prefixes):
        """Per q item the memory's translation, or None: for format text and an item without a
        prefix, with --memory; all None otherwise."""
        if self.memory is None or fmt != "text":
            return [None] * len(items)
        return await self.off_loop(stored, lambda: [
            None if prefix else self.memory.recall(item, self.source_lang, self.target_lang)
            for item, prefix in zip(items, prefixes)])

    async def reload(self, logdir):
        """Loads the newest checkpoint of logdir in the background and serves it from the next
        batch on; returns its name. A UserError says why it cannot be, and the model stays."""
        translator, name = await asyncio.get_running_loop().run_in_executor(
            self.loader, self.load, logdir)
        self.batcher.swap(translator, name)
        self.logdir = logdir
        return name

    def load(self, logdir):
        """(translator, name) of logdir's newest checkpoint, in a graph and session of its own,
        decoded as the served model is; a UserError for a logdir marked rejected, of another
        vocabulary, direction or --maxlen1, or on the ctranslate2 engine."""
        if self.engine != "tensorflow":
            raise UserError("the ctranslate2 engine cannot swap its model: restart serve.py with "
                            "the new --model")
        if not os.path.isdir(logdir):
            raise UserError("%s is not a directory: pass the logdir of a trained model" % logdir)
        check_not_rejected(logdir)
        carried = {flag: getattr(self.hp, flag) for flag in CARRIED_FLAGS
                   if hasattr(self.hp, flag)}
        trained = TrainedModel(trained_hparams(logdir, carried))
        check_same_model(trained, self.vocabulary, self.limit + 1, self.logdir)
        with tf.Graph().as_default():
            translator = Translator(trained, trained.hp.beam_size, with_attention=True)
        return translator, model_name(trained)

    async def off_loop(self, function, *args):
        """function(*args) run in one of the CPU_THREADS, so that the event loop answers other
        requests while it runs."""
        return await asyncio.get_running_loop().run_in_executor(
            self.cpu, functools.partial(function, *args))

    def document(self, text, fmt):
        """A q item as the segments to translate: its lines (or html text runs), each split into
        its sentences unless --no_split."""
        return Document(text, fmt, self.split)

    def wants_attention(self, fields):
        """Whether the request asks for attention (true / 1); a 400 when it cannot have it."""
        attention = flag(fields, "attention")
        if attention and not isinstance(fields["q"], str):
            raise ApiError(400, "Invalid request: attention needs q to be one string")
        if attention and self.engine != "tensorflow":
            raise ApiError(400, "Invalid request: attention needs a server started with --engine "
                                "tensorflow")
        return attention

    def decoding_of(self, fields, alternatives):
        """How a request decodes: (settings, n), its DecodingSettings (the server's with the
        request's REQUEST_OPTIONS on top) and the translations per source. A request for more
        alternatives than the beam has decodes under a beam of alternatives + 1; under sampling,
        its alternatives are further samples. A 400 names a field out of its range, or sampling
        with a beam of more than 1."""
        given = {name: read_option(fields, name, getattr(self.settings, name))
                 for name in REQUEST_OPTIONS if name in fields and name != "min_confidence"}
        settings = dataclasses.replace(self.settings, **given)
        shaping = [option for option in ("sampling_topp", "sampling_temperature")
                   if settings.uses(option)]
        if shaping and not settings.samples():
            raise ApiError(400, "Invalid request: %s shapes the draws of sampling, which "
                                "sampling_topk 1 turns off: send sampling_topk K (0: every "
                                "token) too" % shaping[0])
        if settings.samples() and settings.beam_size > 1:
            raise ApiError(400, "Invalid request: sampling_topk samples one hypothesis at a "
                                "time: it needs a beam of 1, and this server decodes with "
                                "--beam_size %d" % settings.beam_size)
        if settings.samples():
            return settings, alternatives + 1
        if alternatives < settings.beam_size:
            return settings, settings.beam_size
        return dataclasses.replace(settings, beam_size=alternatives + 1), alternatives + 1

    def min_confidence(self, fields):
        """The request's min_confidence (the server's --min_confidence when not given)."""
        return read_option(fields, "min_confidence", self.args.min_confidence)

    def prefixes(self, fields, items):
        """Per q item its target prefix (a string, "" for none): the prefix field, a string (for
        every item) or a list of one string per item of a list q; a 400 for anything else."""
        prefix = fields.get("prefix", "")
        if isinstance(prefix, str):
            return [prefix] * len(items)
        if not isinstance(fields["q"], str) and isinstance(prefix, list) and len(prefix) == len(
                items) and all(isinstance(text, str) for text in prefix):
            return prefix
        raise ApiError(400, "Invalid request: prefix must be a string, or for a list q a list of "
                            "%d strings (one per q item)" % len(items))

    def detect_source(self, items):
        """Per item, the language detected ({"confidence", "language"}); a 400 naming it when an
        item is not in the model's source language. An item with no letters to go by counts as
        the source language with confidence 0."""
        detections = [(candidates(item) or [{"confidence": 0.0, "language": self.source_lang}])[0]
                      for item in items]
        for found in detections:
            if found["language"] != self.source_lang:
                raise ApiError(400, "%s (%s) is not supported: the text looks %s (confidence %g), "
                                    "and this model translates from %s"
                               % (language_name(found["language"]), found["language"],
                                  language_name(found["language"]), found["confidence"],
                                  self.source_lang))
        return detections

    async def answer_items(self, items, fmt, attention, settings, n, prefixes):
        """(entries, maps, count, memory): translate_texts' of the q items that the memory does
        not answer, the memory's pair for the others (memory_entry); memory: per item whether
        the memory answered it, None without --memory."""
        recalled = await self.recall(items, fmt, prefixes)
        todo = [i for i, found in enumerate(recalled) if found is None]
        entries, maps, count = await self.translate_texts(
            [items[i] for i in todo], fmt, attention, settings, n, [prefixes[i] for i in todo])
        translated = dict(zip(todo, entries))
        merged = [translated[i] if found is None else memory_entry(found)
                  for i, found in enumerate(recalled)]
        flags = None if self.memory is None else [found is not None for found in recalled]
        return merged, maps, count, flags

    async def translate_texts(self, texts, fmt, attention=False, settings=None, n=None,
                              prefixes=None):
        """Per text (a q item in format fmt) its n-best entries [Entry], the attention entries
        (when attention), and the count of model inputs translated, decoded under settings with n
        translations per source (None: the translator's own), each text's translation starting
        with its prefix (prefixes: per text a string, "" for none; None for none). The texts become
        model inputs off the event loop."""
        documents, parts, count, source_prefixes = await self.off_loop(self.prepare, texts, fmt,
                                                                       prefixes)
        sources = [source for document in parts for segment in document for source in segment]
        results = await self.batcher.translate(sources, attention, settings, n, source_prefixes)
        entries, maps = read_results(documents, parts, results, self.sp)
        return entries, maps, count

    def prepare(self, texts, fmt, prefixes=None):
        """The texts as documents (document), per document, per segment, the model inputs
        (sentences.prepare), their count (at most --max_sentences), and per model input its target
        prefix (ids, [] for none; None without prefixes): a text's for its first."""
        documents = [self.document(text, fmt) for text in texts]
        parts = [[prepare(segment, self.sp, self.limit)[0] for segment in document.segments]
                 for document in documents]
        count = sum(len(segment) for document in parts for segment in document)
        if count > self.args.max_sentences:
            raise ApiError(400, "Invalid request: %d sentences to translate, more than this "
                                "server's limit of %d (--max_sentences): send fewer per request"
                           % (count, self.args.max_sentences))
        source_prefixes = None if prefixes is None else [
            found for segments, text in zip(parts, prefixes)
            for found in line_prefixes(segments, prefix_ids(text, self.sp))]
        return documents, parts, count, source_prefixes


#: The flags of the served model that a model swapped in is decoded with too.
CARRIED_FLAGS = ("test_batch_size", "beam_size", "alpha", "max_len_a", "max_len_b", "threads",
                 "precision") + tuple(option for option in DECODING_OPTIONS
                                      if option != "ensemble")


def open_translator(hp, engine, model_dir):
    """(translator, sentencepiece model, the dict of src_lang / tgt_lang, the model's name, its
    vocabulary's datadir.fingerprint or None) of the engine: the checkpoint of hp, or the
    CTranslate2 export in model_dir."""
    if engine == "ctranslate2":
        translator = ctranslate2_translator(model_dir, hp, hp.beam_size)
        return translator, translator.sp, vars(hp), model_dir, None
    trained = TrainedModel(hp, hp.ckpt)
    translator = Translator(trained, hp.beam_size, with_attention=True)
    return (translator, trained.sentencepiece(), trained.manifest, model_name(trained),
            datadir.fingerprint(hp.data_dir, trained.manifest))


def model_name(trained):
    """LOGDIR@CHECKPOINT of a TrainedModel: what a stored suggestion records."""
    return "%s@%s" % (trained.hp.logdir, os.path.basename(trained.ckpt))


def check_same_model(trained, vocabulary, maxlen1, served):
    """A UserError unless the TrainedModel reads the served model's ids (its sentencepiece model
    and vocabulary size, vocabulary: the served one's fingerprint), translates its direction and
    takes sources of its --maxlen1: a swap keeps the server's segmentation, its languages
    and its limits."""
    found = datadir.fingerprint(trained.hp.data_dir, trained.manifest)
    logdir = trained.hp.logdir
    if (found["src_lang"], found["tgt_lang"]) != (vocabulary["src_lang"], vocabulary["tgt_lang"]):
        raise UserError("%s translates %s->%s, and this server %s->%s: serve it with another "
                        "serve.py" % (logdir, found["src_lang"], found["tgt_lang"],
                                      vocabulary["src_lang"], vocabulary["tgt_lang"]))
    for key, what in (("bpe_sha256", "sentencepiece model"), ("vocab_size", "vocabulary size")):
        if found[key] != vocabulary[key]:
            raise UserError("%s reads another %s than the served model (%s): swap in a model "
                            "trained on its vocabulary (train.py --init_from)"
                            % (logdir, what, served))
    if trained.hp.maxlen1 < maxlen1:  # the server cuts sources at the served model's length
        raise UserError("%s takes sources of --maxlen1 %d, shorter than the served model's %d: "
                        "swap in a model of at least its --maxlen1"
                        % (logdir, trained.hp.maxlen1, maxlen1))


def open_stores(args):
    """(suggestions, memory): the Stores of --suggestions and --memory (one when they name the
    same file), None for a flag not given; a UserError when one cannot be used."""
    suggestions = Store(args.suggestions) if args.suggestions else None
    if args.memory and suggestions and os.path.abspath(args.memory) == os.path.abspath(
            args.suggestions):
        return suggestions, suggestions
    return suggestions, Store(args.memory) if args.memory else None


def stored(function, *args):
    """function(*args), a call of a Store: a database that cannot be read or written now (locked
    past its busy timeout, a full disk) is a 503, not the server's failure."""
    try:
        return function(*args)
    except sqlite3.Error as error:
        raise ApiError(503, "the suggestions database cannot be used now (%s): try again "
                            "shortly" % error) from None


def memory_entry(text):
    """The n-best of an item the memory answers: its pair alone, of confidence 1."""
    return [Entry(text, 0.0, 1.0, 0.0, 0)]


def language_field(name, value):
    return "%s language %s" % (name, "(none given)" if value is None else repr(value))


def nonnegative_int(fields, name, most, why):
    """A field given as a JSON integer or form digits, from 0 to most (0 when absent);
    a 400 otherwise."""
    value = whole_number(fields, name)
    if value > most:
        raise ApiError(400, "Invalid request: %s %d is more than this server gives (%d: %s)"
                       % (name, value, most, why))
    return value


def flag(fields, name):
    """A boolean field: JSON true or the form value true / 1."""
    value = fields.get(name, False)
    return value is True or str(value).lower() in ("true", "1")


def read_results(documents, parts, results, sp):
    """The translator's results (one per model input, in order) as per document its n-best entries
    [Entry], and the attention entries of every model input
    (when results have attention)."""
    results, entries, maps = iter(results), [], []
    for document, segments in zip(documents, parts):
        sources = [source for segment in segments for source in segment]
        document_results = [next(results) for _ in sources]
        entries.append(translation_entries(document, segments, document_results, sp))
        maps += [attention_entry(source, result.ids, result.attention, sp) for source, result
                 in zip(sources, document_results) if result.attention is not None]
    return entries, maps


def attention_entry(source, ids, weights, sp):
    """One model input's attention for the page: its source and target pieces (with </s>) and the
    (T2, T1) weights averaged over heads."""
    target = [int(i) for i in ids[0] if i != PAD_ID]
    return {"source": [sp.id_to_piece(int(i)) for i in source],
            "target": [sp.id_to_piece(i) for i in target],
            "weights": weights[:, :len(target),
                               :len(source)].mean(0).astype(float).round(4).tolist()}


def translation_body(fields, entries, alternatives, maps, detections, min_confidence=0.0,
                     memory=None):
    """The answer of /translate: per q item its n-best entries [Entry], best first, shaped as q
    was, with its confidence (4 decimals); an entry below min_confidence is left out, the best
    one's translatedText "". detections: per item the language detected (source auto), or None;
    memory: per item whether the memory answered it (with --memory), or None."""
    one = isinstance(fields["q"], str)
    shape = (lambda values: values[0]) if one else (lambda values: values)
    kept = [[entry for entry in document if entry.confidence >= min_confidence]
            for document in entries]
    body = {"translatedText": shape([document[0].text if document and document[0].confidence
                                     >= min_confidence else "" for document in entries]),
            "confidence": shape([round(document[0].confidence, 4) if document else 0.0
                                 for document in entries])}
    if alternatives:
        body["alternatives"] = shape([[entry.text for entry in others(document, full)]
                                      [:alternatives] for document, full in zip(kept, entries)])
    if detections is not None:
        body["detectedLanguage"] = shape(detections)
    if memory is not None:
        body["memory"] = shape(memory)
    if maps is not None:
        body["nbest"] = [{"text": entry.text, "score": round(entry.score, 4),
                          "confidence": round(entry.confidence, 4)} for entry in kept[0]]
        body["attention"] = maps
    return body


def others(kept, entries):
    """The entries of kept (those of entries above min_confidence) but the best of entries."""
    return kept[1:] if kept and kept[0] is entries[0] else kept


def read_option(fields, name, default):
    """A decoding option of a request (a REQUEST_OPTIONS field), default when absent, in the range
    of its flag (hparams.RANGES); a 400 naming it otherwise."""
    read = whole_number if name in WHOLE_OPTIONS else real_number
    return in_range(name, read(fields, name, default), RANGES)


#: The decoding options a request may set, named as their flags; the rest are the server's.
REQUEST_OPTIONS = ("min_len_a", "min_len_b", "sampling_topk", "sampling_topp",
                   "sampling_temperature", "no_repeat_ngram_size", "repetition_penalty",
                   "min_confidence")
#: The options that are whole numbers.
WHOLE_OPTIONS = ("min_len_b", "sampling_topk", "no_repeat_ngram_size")


#: Names of the language codes the server shows (ISO 639-1); another code is shown as itself.
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
                  "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
                  "zh": "Chinese"}

# langdetect draws random samples of the text's n-grams: a fixed seed makes it deterministic
DetectorFactory.seed = 0


def candidates(text):
    """[{"confidence": percent, "language": code}], most likely first; [] when the text has no
    letters to go by (digits, punctuation, nothing)."""
    try:
        found = detect_langs(text)
    except LangDetectException:
        return []
    return [{"confidence": round(100 * language.prob, 1), "language": language.lang}
            for language in found]


def language_name(code):
    return LANGUAGE_NAMES.get(code, code)


def warm_up():
    """Loads langdetect's language profiles now rather than in the first request."""
    candidates("warm up")
