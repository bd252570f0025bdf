"""The model behind serve.py's API: its translator in a Batcher, its sentencepiece model and
languages, the limits of a request, and how a request's fields become the model's inputs and its
results the answer's fields. Every refusal is an ApiError with its HTTP status."""
import asyncio
import concurrent.futures
import functools
import hmac
import os

from langdetect import DetectorFactory, detect_langs
from langdetect.lang_detect_exception import LangDetectException

from toolkit.data import datadir
from toolkit.translating import documents
from toolkit.serving.batcher import ApiError, Batcher
from toolkit.translating.documents import Document
from toolkit.serving.requests import whole_number
from toolkit.base.ids import PAD_ID
from toolkit.translating.sentences import prepare, translation_entries
from toolkit.translating.trained_model import TrainedModel
from toolkit.translating.translator import Translator, ctranslate2_translator


#: Threads that do the CPU work of requests (HTML parsing, sentence splitting, sentencepiece,
#: language detection) off the event loop, so that a long request delays no other client.
CPU_THREADS = 2


class Service:
    """The model behind the server (its translator in a Batcher, sentencepiece, languages), the
    limits, and the threads of the requests' CPU work."""

    def __init__(self, hp, args):
        translator, self.sp, recorded = open_translator(hp, args.engine, args.model)
        # the languages prepro.py recorded (--src_lang, --tgt_lang), or its defaults
        self.source_lang, self.target_lang = datadir.languages(recorded)
        self.engine = args.engine
        # each sentence of a paragraph translated alone, unless --no_split
        self.split = None if args.no_split else functools.partial(documents.split,
                                                                  lang=self.source_lang)
        self.limit, self.beam_size, self.args = hp.maxlen1 - 1, hp.beam_size, args
        self.key = os.fsencode(args.api_key)  # the bytes given on the command line
        # a request for more alternatives than the flags' beam has decodes under a wider beam
        self.most_alternatives = max(args.max_alternatives, hp.beam_size - 1)
        self.batcher = Batcher(translator, hp.test_batch_size, args.batch_wait_ms / 1000,
                               args.queue_size, args.timeout)
        self.cpu = concurrent.futures.ThreadPoolExecutor(CPU_THREADS, "requests")
        warm_up()
        if self.split:
            self.split("Loads the sentencizer now. Not in the first request.")

    def close(self):
        self.cpu.shutdown()
        self.batcher.stop()
        self.batcher.translator.close()

    def check_key(self, fields):
        given = fields.get("api_key", "")
        # compared as bytes: compare_digest takes ASCII strings only; a lone surrogate a client
        # sends encodes to bytes that no key's UTF-8 has
        if self.key and not (isinstance(given, str) and hmac.compare_digest(
                given.encode("utf-8", "surrogatepass"), self.key)):
            raise ApiError(403, "Invalid API key: pass the api_key field this server was started "
                                "with")

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

    def check_languages(self, fields):
        source, target = fields.get("source"), fields.get("target")
        if source not in (self.source_lang, "auto"):
            raise ApiError(400, "%s is not supported: this model translates from %s (or pass auto)"
                                % (language_field("source", source), self.source_lang))
        if target != self.target_lang:
            raise ApiError(400, "%s is not supported: this model translates into %s"
                                % (language_field("target", target), self.target_lang))

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

    def beam_for(self, alternatives):
        """The beam size a request for that many alternatives decodes with: None (the flags')
        when it has enough entries, else alternatives + 1."""
        return None if alternatives < self.beam_size else alternatives + 1

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

    async def translate_texts(self, texts, fmt, attention=False, beam=None):
        """Per text (a q item in format fmt) its n-best entries [(text, score)], the attention
        entries (when attention), and the count of model inputs translated. The texts become model
        inputs off the event loop."""
        documents, parts, count = await self.off_loop(self.prepare, texts, fmt)
        sources = [source for document in parts for segment in document for source in segment]
        results = await self.batcher.translate(sources, attention, beam)
        entries, maps = read_results(documents, parts, results, self.sp)
        return entries, maps, count

    def prepare(self, texts, fmt):
        """The texts as documents (document), and per document, per segment, the model inputs
        (sentences.prepare); at most --max_sentences in all."""
        documents = [self.document(text, fmt) for text in texts]
        parts = [[prepare(segment, self.sp, self.limit)[0] for segment in document.segments]
                 for document in documents]
        count = sum(len(segment) for document in parts for segment in document)
        if count > self.args.max_sentences:
            raise ApiError(400, "Invalid request: %d sentences to translate, more than this "
                                "server's limit of %d (--max_sentences): send fewer per request"
                           % (count, self.args.max_sentences))
        return documents, parts, count


def open_translator(hp, engine, model_dir):
    """(translator, sentencepiece model, the dict of src_lang / tgt_lang) of the engine: the
    checkpoint of hp, or the CTranslate2 export in model_dir."""
    if engine == "ctranslate2":
        translator = ctranslate2_translator(model_dir, hp, hp.beam_size)
        return translator, translator.sp, vars(hp)
    trained = TrainedModel(hp, hp.ckpt)
    translator = Translator(trained, hp.beam_size, with_attention=True)
    return translator, trained.sentencepiece(), trained.manifest


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
    [(text, score)], and the attention entries of every model input
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


def translation_body(fields, entries, alternatives, maps, detections):
    """The answer of /translate: per q item its n-best entries [(text, score)], best first, shaped
    as q was; detections: per item the language detected (source auto), or None."""
    one = isinstance(fields["q"], str)
    shape = (lambda values: values[0]) if one else (lambda values: values)
    body = {"translatedText": shape([document[0][0] for document in entries])}
    if alternatives:
        body["alternatives"] = shape([[text for text, _ in document[1:1 + alternatives]]
                                      for document in entries])
    if detections is not None:
        body["detectedLanguage"] = shape(detections)
    if maps is not None:
        body["nbest"] = [{"text": text, "score": round(score, 4)} for text, score in entries[0]]
        body["attention"] = maps
    return body


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
