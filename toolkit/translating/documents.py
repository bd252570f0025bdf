"""A request's text as the segments to translate and the text kept around them: every line of plain
text, or the text runs between the tags of HTML (the tags, comments and the content of script and
style kept as written); and the document put back together around the segments' translations."""
import collections
import functools
import html
import html.parser
import re

import decoding

#: The end of a marked section: "]]>" of <![CDATA[...]]>, or "]>" of <![if ...]>.
MARKED_SECTION_END = re.compile(r"]\s*]\s*>|]\s*>")


class Document:
    """One q item: the segments to translate, and the text around them that stays
    (template: strings kept and None for each segment's translation). Text: every line is a
    segment. HTML: see HtmlSegments."""

    def __init__(self, q, fmt, split=None):
        """split: a function of a segment into [kept, sentence, kept, ..., kept] (split below), to
        translate each sentence of a segment alone; None keeps a segment whole."""
        self.fmt = fmt
        if fmt == "html":
            parser = HtmlSegments()
            parser.feed(q)
            parser.close()
            self.template, self.segments = parser.template, parser.segments
        else:
            self.segments = q.split("\n")
            self.template = [None if k % 2 == 0 else "\n" for k
                             in range(2 * len(self.segments) - 1)]
        if split is not None:
            self.split_segments(split)

    def split_segments(self, split):
        """Replaces each segment with the sentences split finds in it,
        the text between them kept."""
        template, segments, old = [], [], iter(self.segments)
        for kept in self.template:
            pieces = [kept] if kept is not None else split(next(old))
            for k, piece in enumerate(pieces):
                if k % 2:
                    template.append(None)
                    segments.append(piece)
                elif piece:
                    template.append(piece)
        self.template, self.segments = template, segments

    def render(self, translations):
        """The document with its segments replaced by translations (one per segment, in order)."""
        texts = iter(html.escape(text, quote=False) if self.fmt == "html" else text for text
                     in translations)
        return "".join(next(texts) if kept is None else kept for kept in self.template)


class HtmlSegments(html.parser.HTMLParser):
    """Splits HTML into its text runs between tags (segments, with entities decoded and surrounding
    whitespace left out) and the rest, kept as written: tags with their attributes, comments,
    declarations, whitespace, and the content of script and style."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.template, self.segments, self.raw = [], [], False

    def handle_starttag(self, tag, attrs):
        self.template.append(self.get_starttag_text())
        self.raw = tag in self.CDATA_CONTENT_ELEMENTS

    def handle_startendtag(self, tag, attrs):
        self.template.append(self.get_starttag_text())

    def handle_endtag(self, tag):
        self.template.append("</%s>" % tag)
        self.raw = False

    def handle_data(self, data):
        text = data.strip()
        if self.raw or not text:
            self.template.append(data)
            return
        start = data.index(text)
        self.template += [data[:start], None, data[start + len(text):]]
        self.segments.append(text)

    def handle_comment(self, data):
        self.template.append("<!--%s-->" % data)

    def handle_decl(self, decl):
        self.template.append("<!%s>" % decl)

    def handle_pi(self, data):
        self.template.append("<?%s>" % data)

    def parse_marked_section(self, i, report=1):
        """Keeps a marked section (<![CDATA[...]]>, <![if IE]>, or any keyword) as written: the
        standard parser knows a few keywords and fails on the others."""
        end = MARKED_SECTION_END.search(self.rawdata, i + 3)
        if end is None:
            return -1
        self.template.append(self.rawdata[i:end.end()])
        return end.end()


class Entry(collections.namedtuple("Entry", "text score confidence log_prob tokens")):
    """One n-best entry of a part, a segment or a document: its text, its score, its confidence
    (the geometric mean of its tokens' probabilities, exp(log_prob / tokens); 1 for no tokens),
    and the model's log p of its tokens and their count (with </s>), which entries are joined by."""
    __slots__ = ()

    @classmethod
    def of(cls, text, score, log_prob, tokens):
        return cls(text, float(score), float(decoding.confidence(log_prob, tokens)),
                   float(log_prob), int(tokens))

    @classmethod
    def joined(cls, text, entries):
        """The entry of text made of entries: the sums of their scores, log_probs and tokens."""
        return cls.of(text, sum(entry.score for entry in entries),
                      sum(entry.log_prob for entry in entries),
                      sum(entry.tokens for entry in entries))


#: The entry of a segment with nothing to translate.
EMPTY_ENTRY = Entry("", 0.0, 1.0, 0.0, 0)


def document_entries(document, segment_entries):
    """The n-best of a document: [Entry], entry k with every segment's k-th best, the sum of their
    scores and their confidence together (exp(sum of log_probs / sum of tokens)), as far as every
    segment has a k-th. segment_entries: per segment, nbest_texts' entries."""
    depth = min(len(entries) for entries in segment_entries) if segment_entries else 1
    return [Entry.joined(document.render([entries[k].text for entries in segment_entries]),
                         [entries[k] for entries in segment_entries]) for k in range(depth)]


@functools.lru_cache(maxsize=None)
def sentencizer(lang):
    """A blank spaCy pipeline of lang (of no language, "xx", when spaCy has none) with the
    rule-based sentencizer."""
    import spacy
    try:
        nlp = spacy.blank(lang)
    except (ImportError, KeyError, ValueError):  # spaCy's error for an unknown language code
        nlp = spacy.blank("xx")
    nlp.add_pipe("sentencizer")
    return nlp


#: Most characters spaCy sees at once: far below its limit (nlp.max_length, 1,000,000 characters),
#: and short enough that one call, which holds the interpreter's lock, never holds it for long.
SPACY_PIECE = 10000
#: A run of punctuation and symbols longer than this is shown to spaCy as dashes with a space
#: every MASK_WORD characters, but for its last RUN_END characters: its tokenizer takes time
#: quadratic in the length of such a run (5,000 characters of ".," took seconds); dashes are
#: punctuation that ends no sentence, as the run's inside does not.
LONG_RUN, RUN_END, MASK_WORD = 64, 16, 32
LONG_RUNS = re.compile(r"(?:[^\w\s]|_){%d,}" % (LONG_RUN + 1))
#: A word (a run without whitespace, such as a paragraph of Chinese) longer than this is read in
#: pieces of this many characters.
LONG_WORD = 500
LONG_WORDS = re.compile(r"(?<!\S)\S{%d}" % (LONG_WORD + 1))


def split(text, lang):
    """[kept, sentence, kept, sentence, ..., kept]: text's sentences (odd places, stripped) and the
    text around them (even places); joined, they give text back. spaCy reads the text in pieces of
    at most SPACY_PIECE characters, each ending at whitespace and starting where the last sentence
    of the piece before started, so that a text of any length splits as spaCy would split it
    whole; a sentence longer than a piece is cut at the piece's end."""
    starts, begin = [], 0
    while begin < len(text):
        end = piece_end(text, begin)
        found = [begin + start for start in sentence_starts(text[begin:end], lang)]
        # the last sentence may go on past the piece: the next piece starts with it
        begin = found.pop() if end < len(text) and len(found) > 1 else end
        starts += found
    pieces, kept_from = [], 0
    for start, stop in zip(starts, starts[1:] + [len(text)]):
        sentence = text[start:stop]
        words = sentence.strip()
        if words:
            start += len(sentence) - len(sentence.lstrip())
            pieces += [text[kept_from:start], words]
            kept_from = start + len(words)
    return pieces + [text[kept_from:]]


def piece_end(text, begin):
    """Where the piece of text from begin ends: before a word (a run without whitespace) longer
    than LONG_WORD, or LONG_WORD characters into one (spaCy's tokenizer takes time quadratic in
    a word's length); else at the text's end, or after the last whitespace of the piece's second
    half, or SPACY_PIECE characters on when it has none."""
    end = min(begin + SPACY_PIECE, len(text))
    long_word = LONG_WORDS.search(text, begin, end)
    if long_word:
        return long_word.start() if long_word.start() > begin else begin + LONG_WORD
    if end == len(text):
        return end
    cut = max(text.rfind(space, begin + SPACY_PIECE // 2, end) for space in (" ", "\n", "\t"))
    return cut + 1 if cut >= 0 else end


def sentence_starts(piece, lang):
    """Where spaCy's sentencizer starts each sentence of piece (0 first), long runs of punctuation
    shown as dashes but for their ends (LONG_RUN)."""
    shown = LONG_RUNS.sub(masked, piece)
    return [sentence.start_char for sentence in sentencizer(lang)(shown).sents] or [0]


def masked(run):
    """A long run of punctuation (a match of LONG_RUNS) as sentence_starts shows it to spaCy: as
    long, so that the offsets hold."""
    inside = len(run.group()) - RUN_END
    words = ("-" * (MASK_WORD - 1) + " ") * (inside // MASK_WORD + 1)
    return words[:inside] + run.group()[-RUN_END:]
