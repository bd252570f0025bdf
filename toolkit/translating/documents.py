"""A request's text as the segments to translate and the text kept around them: every line of plain
text, or the text runs between the tags of HTML (the tags, comments and the content of script and
style kept as written); and the document put back together around the segments' translations."""
import functools
import html
import html.parser
import re


#: The end of a marked section: "]]>" of <![CDATA[...]]>, or "]>" of <![if ...]>.
MARKED_SECTION_END = re.compile(r"]\s*]\s*>|]\s*>")


class Document:
    """One q item: the segments to translate, and the text around them that stays (template: strings
    kept and None for each segment's translation). Text: every line is a segment. HTML: see
    HtmlSegments."""

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
        """Replaces each segment with the sentences split finds in it, the text between them
        kept."""
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


def document_entries(document, segment_entries):
    """The n-best of a document: [(text, score)], entry k with every segment's k-th best and the sum
    of their scores, as far as every segment has a k-th. segment_entries: per segment, nbest_texts'
    entries."""
    depth = min(len(entries) for entries in segment_entries) if segment_entries else 1
    return [(document.render([entries[k][0] for entries in segment_entries]),
             sum(entries[k][1] for entries in segment_entries)) for k in range(depth)]


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


def split(text, lang):
    """[kept, sentence, kept, sentence, ..., kept]: text's sentences (odd places, stripped) and the
    text around them (even places); joined, they give text back."""
    pieces, end = [], 0
    for sentence in sentencizer(lang)(text).sents:
        words = sentence.text.strip()
        if not words:
            continue
        start = sentence.start_char + sentence.text.index(words)
        pieces += [text[end:start], words]
        end = start + len(words)
    return pieces + [text[end:]]
