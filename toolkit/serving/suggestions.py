"""What serve.py keeps in a SQLite database (the standard library's sqlite3): the corrections users
suggest (LibreTranslate's /suggest), and the translation memory, the pairs a request is answered
from without the model.

    store = Store("suggestions.db")          # created if new; one line if corrupt or locked
    store.suggest(q, s, "de", "en", model="runs/m30k@best-6400", translation="...")
    store.accept(ids)                        # suggestions become memory pairs
    store.remember(q, s, "de", "en")         # a pair of an imported file
    store.recall(q, "de", "en")              # the memory's translation of q, or None
    store.pairs("de", "en")                  # what fine-tuning reads

A suggestion is stored once (the same q, s and languages again only counts again), with the time,
the model that translated q and its translation. The memory is keyed by the normalised text
(reading.clean_line: NFC, whitespace runs as one space, trimmed), so a request that differs only in
spacing finds its pair. Every write is one transaction committed before its call returns, in
write-ahead-log mode with synchronous FULL: what a caller acknowledged survives a kill of the
process and a power cut. Each call reads the database afresh, so pairs that another process adds
take effect at once.
"""
import sqlite3
import threading
import time

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
