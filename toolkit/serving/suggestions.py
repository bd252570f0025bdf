"""What serve.py keeps in a SQLite database (the standard library's sqlite3): the corrections users
suggest (LibreTranslate's /suggest), and the translation memory, the pairs a request is answered
from without the model.

    store = Store("suggestions.db")          # created if new; one line if corrupt or locked
    store.suggest(q, s, "de", "en", model="runs/m30k@best-6400", translation="...")
    store.accept(ids)                        # suggestions become memory pairs
    store.remember(q, s, "de", "en")         # a pair of an imported file
    store.recall(q, "de", "en")              # the memory's translation of q, or None
    store.pairs("de", "en")                  # what fine-tuning reads

From the shell (python -m toolkit.serving.suggestions COMMAND --help says more):

    python -m toolkit.serving.suggestions import SRC TGT --db DB --source de --target en
    python -m toolkit.serving.suggestions accept --db DB (--all | ID ...)
    python -m toolkit.serving.suggestions list --db DB [--status new]

A suggestion is stored once (the same q, s and languages again only counts again), with the time,
the model that translated q and its translation. The memory is keyed by the normalised text
(reading.clean_line: NFC, whitespace runs as one space, trimmed), so a request that differs only in
spacing finds its pair. Every write is one transaction committed before its call returns, in
write-ahead-log mode with synchronous FULL: what a caller acknowledged survives a kill of the
process and a power cut. Each call reads the database afresh, so pairs that another process adds
take effect at once.
"""
import argparse
import sqlite3
import threading
import time

from toolkit.base.cli import run_cli
from toolkit.base.errors import UserError
from toolkit.base.reading import clean_line

#: The tables, created when missing. `status` of a suggestion: new, accepted or rejected.
SCHEMA = """
CREATE TABLE IF NOT EXISTS suggestions (
    id INTEGER PRIMARY KEY,
    q TEXT NOT NULL, s TEXT NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL,
    created REAL NOT NULL, model TEXT, translation TEXT,
    count INTEGER NOT NULL DEFAULT 1, status TEXT NOT NULL DEFAULT 'new',
    UNIQUE (q, s, source, target));
CREATE TABLE IF NOT EXISTS memory (
    key TEXT NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL,
    q TEXT NOT NULL, s TEXT NOT NULL, origin TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (key, source, target));
"""

#: How long a write waits for another connection's lock before it fails, in seconds.
BUSY_TIMEOUT = 10


def memory_key(text):
    """The text a memory pair is found by: q cleaned as prepro.py cleans training text."""
    return clean_line(text)


class Store:
    """The suggestions and the translation memory in the SQLite database `path` (created when
    missing). One connection, used by one thread at a time (a lock), from any thread."""

    def __init__(self, path):
        self.path, self.lock = path, threading.Lock()
        try:
            self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, check_same_thread=False,
                                      isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            problem = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(problem)
            self.db.executescript(SCHEMA)
        except sqlite3.Error as error:
            raise UserError("cannot use %s as the suggestions database (%s): move it away to "
                            "start a new one, or give another file" % (path, error)) from None

    def close(self):
        self.db.close()

    def write(self, sql, *rows):
        """Runs sql once per row in one transaction, committed before it returns."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    self.db.execute(sql, row)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def read(self, sql, *args):
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def suggest(self, q, s, source, target, model=None, translation=None):
        """Stores a suggestion: s for q, from source into target; model and translation: what the
        server answered for q. The same suggestion again counts once more."""
        self.write("INSERT INTO suggestions (q, s, source, target, created, model, translation) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (q, s, source, target) "
                   "DO UPDATE SET count = count + 1",
                   (q, s, source, target, time.time(), model, translation))

    def accept(self, ids):
        """Marks the suggestions `ids` accepted and puts them in the memory."""
        rows = [row for i in ids for row in self.read(
            "SELECT q, s, source, target FROM suggestions WHERE id = ?", i)]
        self.write("UPDATE suggestions SET status = 'accepted' WHERE id = ?",
                   *[(i,) for i in ids])
        self.remember_all(rows, "suggestion")

    def remember(self, q, s, source, target, origin="import"):
        """Puts one pair in the memory (a pair for the same text replaces the one before)."""
        self.remember_all([(q, s, source, target)], origin)

    def remember_all(self, pairs, origin):
        """Puts (q, s, source, target) pairs in the memory in one transaction."""
        now = time.time()
        self.write("INSERT OR REPLACE INTO memory (key, source, target, q, s, origin, created) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)",
                   *[(memory_key(q), source, target, q, s, origin, now)
                     for q, s, source, target in pairs])

    def recall(self, q, source, target):
        """The memory's translation of q from source into target, or None."""
        rows = self.read("SELECT s FROM memory WHERE key = ? AND source = ? AND target = ?",
                         memory_key(q), source, target)
        return rows[0][0] if rows else None

    def suggestions(self, source, target, status=None):
        """[(id, q, s)] of the suggestions from source into target (of one status, or all)."""
        sql = "SELECT id, q, s FROM suggestions WHERE source = ? AND target = ?"
        args = (source, target)
        if status:
            sql, args = sql + " AND status = ?", args + (status,)
        return self.read(sql + " ORDER BY id", *args)

    def pairs(self, source, target):
        """[(q, s)] of every suggestion not rejected from source into target, oldest first: what
        fine-tuning on corrections reads."""
        return self.read("SELECT q, s FROM suggestions WHERE source = ? AND target = ? AND "
                         "status != 'rejected' ORDER BY id", source, target)


# ---------------------------------------------------------------- the commands
def build_parser():
    """The commands' parser: import, accept and list, each with --db."""
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.serving.suggestions",
        description="Feed and read the database of serve.py --suggestions / --memory: import a "
                    "pair file into the translation memory, accept suggestions into it, list "
                    "the suggestions. serve.py reads the database afresh on every request: no "
                    "restart is needed.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    imported = commands.add_parser("import", help="put the pairs of two line-aligned files in "
                                                  "the memory")
    imported.add_argument("src", metavar="SRC", help="a UTF-8 file of source lines")
    imported.add_argument("tgt", metavar="TGT", help="a UTF-8 file of their translations, line "
                                                     "by line (as many lines as SRC)")
    imported.add_argument("--source", required=True, help="the source language code, e.g. de")
    imported.add_argument("--target", required=True, help="the target language code, e.g. en")
    accepted = commands.add_parser("accept", help="mark suggestions accepted: they become memory "
                                                  "pairs that answer their text from now on")
    accepted.add_argument("ids", metavar="ID", nargs="*", type=int,
                          help="the suggestions' ids (the first column of list)")
    accepted.add_argument("--all", action="store_true", help="every suggestion still new")
    listed = commands.add_parser("list", help="print the suggestions, one per line: id, status, "
                                              "direction, count, q ||| s")
    listed.add_argument("--status", choices=["new", "accepted", "rejected"],
                        help="only the suggestions of this status (default: all)")
    for command in (imported, accepted, listed):
        command.add_argument("--db", required=True, metavar="DB",
                             help="the SQLite file (serve.py's --suggestions or --memory)")
    return parser


def import_pairs(store, args):
    """The command import: the pairs of args.src and args.tgt into the memory, one
    transaction; a pair with an empty side is left out."""
    sources, targets = (read_lines(path) for path in (args.src, args.tgt))
    if len(sources) != len(targets):
        raise UserError("%s has %d lines and %s %d: pass two files of one pair per line"
                        % (args.src, len(sources), args.tgt, len(targets)))
    pairs = [(q, s, args.source, args.target) for q, s in zip(sources, targets)
             if q.strip() and s.strip()]
    store.remember_all(pairs, "import")
    print("imported %d pairs %s->%s into %s (%d with an empty side left out)"
          % (len(pairs), args.source, args.target, args.db, len(sources) - len(pairs)))


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as lines:
            return lines.read().splitlines()
    except UnicodeDecodeError:
        raise UserError("%s is not UTF-8 text: convert it to UTF-8" % path) from None


def accept_suggestions(store, args):
    """The command accept: the ids given (each must exist), or --all of those still new."""
    if args.all == bool(args.ids):
        raise UserError("accept takes suggestion ids or --all, one of the two: see `list`")
    ids = [row[0] for row in store.read("SELECT id FROM suggestions WHERE status = 'new' "
                                        "ORDER BY id")] if args.all else args.ids
    known = {row[0] for row in store.read("SELECT id FROM suggestions")}
    unknown = [str(i) for i in ids if i not in known]
    if unknown:
        raise UserError("no suggestion with id %s in %s: `list` shows the ids"
                        % (", ".join(unknown), args.db))
    store.accept(ids)
    print("accepted %d suggestions into the memory of %s" % (len(ids), args.db))


def list_suggestions(store, args):
    """The command list: one line per suggestion, oldest first."""
    sql, params = "SELECT id, status, source, target, count, q, s FROM suggestions", ()
    if args.status:
        sql, params = sql + " WHERE status = ?", (args.status,)
    for row in store.read(sql + " ORDER BY id", *params):
        print("%d\t%s\t%s->%s\t%d\t%s ||| %s" % row)


COMMANDS = {"import": import_pairs, "accept": accept_suggestions, "list": list_suggestions}


def main(argv=None):
    args = build_parser().parse_args(argv)
    store = Store(args.db)
    try:
        COMMANDS[args.command](store, args)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    run_cli(main)
