"""Raw text lines into the model's inputs, and its outputs back into lines: reading an input file,
splitting a line into its sentences (unless kept whole), cleaning and segmenting each, splitting one
longer than the model was trained on into parts that fit, and joining the parts' translations (their
n-best entries) into the sentence's, the sentences' into the line's with the text between them."""
import functools
import sys

import decoding
from data_load import run_in_length_batches
from toolkit.translating.documents import EMPTY_ENTRY, Document, Entry, document_entries
from toolkit.base.errors import UserError
from toolkit.base.ids import EOS_ID, PAD_ID, UNK_ID
from toolkit.base.reading import clean_line, decode_lines
from utils import postprocess


#: Where a too-long line may be cut, best first: (description, test of the cut before pieces[k]).
CUT_RULES = (
    ("after sentence punctuation", lambda pieces, k: pieces[k - 1].endswith((".", "!", "?"))),
    ("after , ; or :", lambda pieces, k: pieces[k - 1].endswith((",", ";", ":"))),
    ("between words", lambda pieces, k: pieces[k].startswith("\u2581")),
    ("inside a word", lambda pieces, k: True),
)


#: The notes on a line with nothing to translate.
INVALID_NOTE = "is not valid UTF-8; printed an empty line"
EMPTY_NOTE = "is empty; printed an empty line"


def read_input(fpath, flag="input"):
    """Lines of a UTF-8 file given as --flag ('\\r\\n', a byte-order mark and a missing final
    newline are fine). Invalid UTF-8 is a UserError naming the line."""
    try:
        with open(fpath, "rb") as f:
            data = f.read()
        return decode_lines(data, fpath)
    except OSError as error:
        raise UserError("cannot read --%s %s: %s" % (flag, fpath, error.strerror)) from None


def read_pair(source, reference, flags):
    """The lines of a source file and of its reference file, given as flags (two names); a different
    number of lines is a UserError."""
    sources, references = read_input(source, flags[0]), read_input(reference, flags[1])
    if len(sources) != len(references):
        raise UserError("--%s %s has %d lines but --%s %s has %d: give one reference line per "
                        "source line"
                        % (flags[0], source, len(sources), flags[1], reference, len(references)))
    return sources, references


def stdin_lines():
    """Yields each line of standard input as soon as it is complete, without its line ending; None
    for a line that is not valid UTF-8. Shows a prompt on stderr when
    standard input is a terminal."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a sentence and press Enter; Ctrl-D ends.", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = sys.stdin.buffer.readline()
        if not raw:
            return
        raw = raw.rstrip(b"\n").rstrip(b"\r").removeprefix(b"\xef\xbb\xbf")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        yield text


def best_cut(pieces, limit):
    """Where to cut pieces (longer than limit): (k in 1..limit, so that pieces[:k] is the first
    part, and the CUT_RULES description of the cut). The best kind of cut wins; among equals, the
    longest first part."""
    for description, allowed in CUT_RULES:
        for k in range(limit, 0, -1):
            if allowed(pieces, k):
                return k, description


def split_pieces(pieces, limit):
    """Splits a list of pieces into parts of at most limit pieces (see best_cut).

    Returns the parts and the descriptions of the cuts made (empty when pieces fit)."""
    parts, cuts, start = [], [], 0
    while len(pieces) - start > limit:
        # best_cut reads limit + 1 pieces at most: a window, so that a long line costs linear time
        k, description = best_cut(pieces[start:start + limit + 1], limit)
        parts.append(pieces[start:start + k])
        cuts.append(description)
        start += k
    return parts + [pieces[start:]], cuts


def prepare(text, sp, limit):
    """Raw text -> (parts, notes): parts is a list of source id lists, each ending in </s>
    and at most limit + 1 long ([] for an empty line); notes are the things to tell the user
    about this line."""
    if text is None:
        return [], [INVALID_NOTE]
    pieces = sp.encode(clean_line(text), out_type=str)
    if not pieces:
        return [], [EMPTY_NOTE]
    notes = []
    unknown = sorted({p for p in pieces if sp.piece_to_id(p) == UNK_ID})
    if unknown:
        notes.append("has pieces outside the model's vocabulary, read as <unk>: %s"
                     % " ".join(unknown))
    piece_parts, cuts = split_pieces(pieces, limit)
    if cuts:
        kinds = [description for description, _ in CUT_RULES if description in cuts]
        notes.append("has %d pieces, more than the %d (and </s>) the model was trained on "
                     "(--maxlen1 %d): translated in %d parts, cut %s"
                     % (len(pieces), limit, limit + 1, len(piece_parts),
                                                         ", ".join(kinds)))
    return [[sp.piece_to_id(p) for p in part] + [EOS_ID] for part in piece_parts], notes


def nbest_texts(part_results, sp):
    """part_results: the translator's results (decoding.Translation) of one line's parts. Returns
    [Entry], best first: entry k joins the k-th best translation of every part, with the sum of
    their scores and their confidence together (Entry.joined)."""
    texts = [postprocess(result.ids, sp) for result in part_results]  # per part, K texts
    entries = []
    for k in range(len(texts[0])):
        parts = [Entry.of(part[k], result.scores[k], result.log_probs[k],
                          (result.ids[k] != PAD_ID).sum()) for part, result
                 in zip(texts, part_results)]
        if min(part.score for part in parts) > decoding.NEG_INF / 2:
            entries.append(Entry.joined(" ".join(part.text for part in parts), parts))
    return entries


def output_lines(number, entries, nbest, min_confidence=0.0):
    """The lines printed for input line `number` (1-based): the best text, or with nbest > 1 up to
    nbest lines `number-1 ||| text ||| score ||| confidence`. entries: [Entry], best first; []
    for an empty line. An entry whose confidence is below min_confidence is left out (the best
    one printed as an empty line)."""
    kept = [entry for entry in entries if entry.confidence >= min_confidence]
    if nbest == 1:
        return [entries[0].text if entries and kept and kept[0] is entries[0] else ""]
    return ["%d ||| %s ||| %.4f ||| %.4f" % (number - 1, entry.text, entry.score,
                                             entry.confidence) for entry in kept] or [
        "%d |||  ||| 0.0000 ||| 0.0000" % (number - 1)]


def confidence_notes(entries, min_confidence):
    """The note on a line whose translation (its best entry) is below min_confidence."""
    if entries and entries[0].confidence < min_confidence:
        return ["has confidence %.4f, below --min_confidence %g: printed an empty line"
                % (entries[0].confidence, min_confidence)]
    return []


def report(where, number, notes):
    """Prints the notes about one input line on stderr."""
    for note in notes:
        print("%s %d %s" % (where, number, note), file=sys.stderr, flush=True)


def prepare_line(text, sp, limit, split=None):
    """A raw line -> (document, segment_parts, notes): the line as a Document of one text segment,
    or with split (documents.split of the source language) of its sentences and the text
    between them; prepare()'s parts of each segment; and the notes about the line. A line with
    nothing to translate (empty, or not valid UTF-8) is (None, [], notes). Line breaks inside
    the line (a sentence given as an argument may have them) are read as spaces:
    one line in, one out."""
    if text is None:
        return None, [], [INVALID_NOTE]
    document = Document(" ".join(text.splitlines()), "text", split)
    prepared = [prepare(segment, sp, limit) for segment in document.segments]
    if not any(parts for parts, _ in prepared):
        return None, [], [EMPTY_NOTE]
    return (document, [parts for parts, _ in prepared],
            [note for parts, notes in prepared if parts for note in notes])


def translation_entries(document, segment_parts, results, sp):
    """The n-best entries [Entry] of a document (a line: prepare_line) from the results of
    its segments' parts, in order: every segment's entries (nbest_texts; "" for a segment with
    nothing to translate, or whose every entry beam search left unfilled) put back into the
    document (documents.document_entries). [] for no document."""
    if document is None:
        return []
    results, segment_entries = iter(results), []
    for parts in segment_parts:
        part_results = [next(results) for _ in parts]
        segment_entries.append((nbest_texts(part_results, sp) if parts else []) or [EMPTY_ENTRY])
    return document_entries(document, segment_entries)


class Prefixed(list):
    """A source's ids (a list, so that run_in_length_batches orders it by its length) with the
    target prefix (ids, [] for none) that its translations start with."""

    def __init__(self, ids, prefix):
        super().__init__(ids)
        self.prefix = prefix


def run_sources(translator, sources, prefixes=None, progress=False, **options):
    """translator.run(batch, **options) over sources in batches of similar length
    (run_in_length_batches); returns one result per source, in order. prefixes: None, or per source
    its target prefix ([] for none), each batch's passed along with its sources (prefixes=None to a
    batch without one)."""
    if not prefixes or not any(prefixes):
        return run_in_length_batches(functools.partial(translator.run, **options), sources,
                                     translator.batch_size, progress)

    def run_batch(batch):
        found = [source.prefix for source in batch]
        return translator.run([list(source) for source in batch],
                              prefixes=found if any(found) else None, **options)
    return run_in_length_batches(run_batch, [Prefixed(source, prefix) for source, prefix
                                             in zip(sources, prefixes)], translator.batch_size,
                                 progress)


def line_prefixes(segments, prefix):
    """Per model input of a line (its segments' parts), its target prefix: the line's prefix (ids,
    [] for none) for its first, [] for the others."""
    count = sum(len(parts) for parts in segments)
    return [prefix if k == 0 else [] for k in range(count)]


def prefix_ids(text, sp):
    """A target prefix line as ids: cleaned and segmented as target text, without </s>; [] for an
    empty line."""
    return [sp.piece_to_id(piece) for piece in sp.encode(clean_line(text), out_type=str)]


def translated_lines(translator, lines, sp, limit, where, split=None, prefixes=None):
    """Translates a list of lines in batches (prepare_line); yields each line's model inputs and
    their results (Translator.run), and its n-best entries, in order. Notes about the lines go to
    stderr, `where` naming them. prefixes: None, or per line the target prefix (ids, [] for none)
    that its first model input's translations start with."""
    prepared = [prepare_line(text, sp, limit, split) for text in lines]
    for number, (_, _, notes) in enumerate(prepared, 1):
        report(where, number, notes)
    sources = [source for _, segments, _ in prepared for parts in segments for source in parts]
    source_prefixes = None if prefixes is None else [
        found for (_, segments, _), prefix in zip(prepared, prefixes)
        for found in line_prefixes(segments, prefix)]
    results = iter(run_sources(translator, sources, source_prefixes, progress=True))
    for document, segments, _ in prepared:
        inputs = [source for parts in segments for source in parts]
        line_results = [next(results) for _ in inputs]
        yield inputs, line_results, translation_entries(document, segments, line_results, sp)


def best_translations(translator, lines, sp, limit, where, min_confidence=0.0, prefixes=None):
    """The best translation of each of a list of lines, each translated whole, in order ("" for an
    empty line, and for one whose confidence is below min_confidence, with a note on stderr); and
    how many were dropped below min_confidence. prefixes: as in translated_lines."""
    hypotheses, dropped = [], 0
    for number, (_, _, entries) in enumerate(translated_lines(translator, lines, sp, limit, where,
                                                              prefixes=prefixes), 1):
        notes = confidence_notes(entries, min_confidence)
        report(where, number, notes)
        dropped += bool(notes)
        hypotheses.append(output_lines(number, entries, 1, min_confidence)[0])
    return hypotheses, dropped
