"""A paragraph split into its sentences, for a model trained on single sentences (which drops or
merges sentences of a paragraph decoded whole): spaCy's rule-based sentencizer on a blank pipeline
of the language, so no statistical model is downloaded, and every sentence keeps its character
offsets, so that the text between sentences (spaces, tabs) is kept exactly as written. spaCy is
imported when the first text is split: a tool's start and its errors do not wait for it."""
import functools


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
