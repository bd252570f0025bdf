"""toolkit/serving/suggestions.py: the SQLite store of suggestions and of the translation memory, on a real file."""
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from toolkit.base.errors import UserError
from toolkit.serving.suggestions import Store

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_suggestion_is_stored_once_with_its_model_and_translation(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    store.suggest("Ein Hund.", "A dog.", "de", "en", model="runs/x@model-10", translation="A cat.")
    store.suggest("Ein Hund.", "A dog.", "de", "en", model="runs/x@model-10", translation="A cat.")
    store.suggest("Ein Hund.", "One dog.", "de", "en")
    store.close()
    db = sqlite3.connect(str(tmp_path / "s.db"))  # another connection sees what was committed
    rows = db.execute("SELECT q, s, source, target, model, translation, count, status FROM suggestions "
                      "ORDER BY id").fetchall()
    assert rows == [("Ein Hund.", "A dog.", "de", "en", "runs/x@model-10", "A cat.", 2, "new"),
                    ("Ein Hund.", "One dog.", "de", "en", None, None, 1, "new")]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_memory_answers_the_normalised_text_and_sees_other_writers_at_once(tmp_path):
    path = str(tmp_path / "s.db")
    server, other = Store(path), Store(path)
    assert server.recall("Ein Hund.", "de", "en") is None
    other.suggest("Ein  Hund. ", "A dog.", "de", "en")
    assert server.recall("Ein Hund.", "de", "en") is None  # a suggestion is not a pair until accepted
    [(suggestion, _, _)] = other.suggestions("de", "en")
    other.accept([suggestion])
    assert server.recall("Ein Hund.", "de", "en") == "A dog."
    assert server.recall("Ein Hund.", "de", "fr") is None
    other.remember("Zwei Katzen.", "Two cats.", "de", "en")
    assert server.recall("  Zwei\tKatzen.", "de", "en") == "Two cats."
    assert server.pairs("de", "en") == [("Ein  Hund. ", "A dog.")]


def test_a_corrupt_database_is_one_line(tmp_path):
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="cannot use .*s.db as the suggestions database .*move it away"):
        Store(str(path))


def test_a_locked_database_is_one_line(tmp_path):
    path = str(tmp_path / "s.db")
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        import toolkit.serving.suggestions as suggestions
        old, suggestions.BUSY_TIMEOUT = suggestions.BUSY_TIMEOUT, 0.2
        try:
            with pytest.raises(UserError, match="cannot use .* as the suggestions database .*locked"):
                Store(path)
        finally:
            suggestions.BUSY_TIMEOUT = old
    finally:
        holder.execute("ROLLBACK")


def test_what_a_killed_writer_acknowledged_is_in_the_database(tmp_path):
    """A process stores suggestions, printing each id after its call returned, and is SIGKILLed mid-stream: every
    acknowledged suggestion is there afterwards and the database passes integrity_check."""
    path = str(tmp_path / "s.db")
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from toolkit.serving.suggestions import Store
        store = Store(%r)
        for i in range(100000):
            store.suggest("q%%d" %% i, "s%%d" %% i, "de", "en")
            print(i, flush=True)
    """ % (REPO_ROOT, path))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acknowledged = [child.stdout.readline() for _ in range(300)]
    child.kill()
    child.wait()
    acknowledged = {int(line) for line in acknowledged if line.strip()}
    db = sqlite3.connect(path)
    stored = {int(q[1:]) for (q,) in db.execute("SELECT q FROM suggestions")}
    assert acknowledged <= stored
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
