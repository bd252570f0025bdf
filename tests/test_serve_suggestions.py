"""serve.py's suggestions, translation memory and model swap against a real server on 127.0.0.1 with a real SQLite
file: LibreTranslate's /suggest (JSON and form, 403 when off, 400 per missing field in its order, the stored row with
the model and its translation); nothing acknowledged is lost when the server is SIGKILLed mid-stream; the memory
answers a normalised match, sees pairs another connection adds without a restart, and leaves the rest to the model;
the commands import / accept / list; a new model swapped in (POST /admin/reload, SIGHUP) under 8 clients with no
failed request, and a rejected or other-vocabulary logdir refused while the old model keeps serving. Also the
batcher's swap alone."""
import http.client
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import translate
from model_fixtures import TINY_MODEL_MAXLEN1
from toolkit.serving import suggestions
from toolkit.serving.batcher import Batcher
from toolkit.serving.suggestions import Store
from toolkit.training.logdir import mark_rejected

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_serve  # noqa: E402

KEY = "k3y"
SENTENCE = "Heute ist der zweite Oktober zweitausendeinundvierzig."
#: Sentences the session's tiny model and the one trained on from it translate, not all alike.
PROBES = [SENTENCE, "Die Zahl ist sechshundertneunundneunzig.", "der neunte September", "Er zählt bis elf.",
          "Heute ist der erste Mai."]
CHAR_LIMIT = 300
DISABLED = "Suggestions are disabled on this server."


def post(server, path, fields, key=KEY, form=False):
    """(status, answer) of a post of fields (with api_key when key), JSON or a urlencoded form."""
    fields = {**fields, **({"api_key": key} if key else {})}
    if form:
        body, headers = urllib.parse.urlencode(fields).encode(), {}
    else:
        body, headers = json.dumps(fields).encode(), {"Content-Type": "application/json"}
    request = urllib.request.Request(server.url + path, body, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def translated(server, q, key=KEY):
    status, answer = post(server, "translate", {"q": q, "source": "de", "target": "en"}, key)
    assert status == 200, answer
    return answer


def rows(database, sql="SELECT q, s, source, target, model, translation FROM suggestions ORDER BY id"):
    with sqlite3.connect(database) as db:
        return db.execute(sql).fetchall()


def serve_flags(tiny_model, *flags):
    logdir, data_dir = tiny_model
    return ["--logdir", logdir, "--data_dir", data_dir, "--beam_size", "1", "--no_split", *flags]


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    return str(tmp_path_factory.mktemp("suggestions") / "suggestions.db")


@pytest.fixture(scope="module")
def server(tiny_model, database):
    """serve.py with --suggestions and --memory on one file, an api key and a character limit."""
    with bench_serve.Server(serve_flags(tiny_model, "--suggestions", database, "--memory", database, "--api_key",
                                        KEY, "--char_limit", str(CHAR_LIMIT))) as running:
        yield running


@pytest.fixture(scope="module")
def plain_server(tiny_model):
    """serve.py without --suggestions, --memory or --api_key."""
    with bench_serve.Server(serve_flags(tiny_model)) as running:
        yield running


# ---------------------------------------------------------------- /suggest
def test_suggest_in_json_and_form_stores_the_row_with_the_model_and_its_translation(server, database, tiny_model):
    before = len(rows(database))
    q = "Die Zahl ist sechshundertneunundneunzig."
    assert post(server, "suggest", {"q": q, "s": "The number is 699.", "source": "de", "target": "en"}) == (
        200, {"success": True})
    assert post(server, "suggest", {"q": "der neunte September", "s": "the ninth of September", "source": "de",
                                    "target": "en", "translation": "what the page showed"}, form=True) == (
        200, {"success": True})
    first, second = rows(database)[before:]
    model = first[4]
    assert model.startswith(tiny_model[0] + "@")  # LOGDIR@CHECKPOINT
    assert os.path.exists(os.path.join(tiny_model[0], model.split("@")[1] + ".index"))
    # the server's own translation of q, as /translate answers it; or what the request says the page showed
    assert first == (q, "The number is 699.", "de", "en", model, translated(server, q)["translatedText"])
    assert second == ("der neunte September", "the ninth of September", "de", "en", model, "what the page showed")


def test_suggest_is_403_with_libretranslate_s_words_when_off_and_settings_say_so(server, plain_server):
    fields = {"q": SENTENCE, "s": "x", "source": "de", "target": "en"}
    assert post(plain_server, "suggest", fields, key="") == (403, {"error": DISABLED})
    for running, on in ((server, True), (plain_server, False)):
        with urllib.request.urlopen(running.url + "frontend/settings") as response:
            assert json.loads(response.read())["suggestions"] is on


@pytest.mark.parametrize("fields, missing", [
    ({}, "q"), ({"s": "x", "source": "de", "target": "en"}, "q"), ({"q": "", "s": "x"}, "q"),
    ({"q": SENTENCE}, "s"), ({"q": SENTENCE, "target": "en"}, "s"), ({"q": SENTENCE, "s": "x"}, "source"),
    ({"q": SENTENCE, "s": "x", "target": "en"}, "source"), ({"q": SENTENCE, "s": "x", "source": "de"}, "target"),
])
def test_a_missing_field_is_libretranslate_s_400_in_its_order(server, fields, missing):
    for form in (False, True):
        assert post(server, "suggest", fields, form=form) == (
            400, {"error": "Invalid request: missing %s parameter" % missing})


@pytest.mark.parametrize("fields, key, status, message", [
    ({}, "wrong", 403, "Invalid API key"),
    ({}, "", 403, "Invalid API key"),
    ({"q": "x" * (CHAR_LIMIT + 1)}, KEY, 400, "--char_limit"),
    ({"s": "x" * (CHAR_LIMIT + 1)}, KEY, 400, "s has 301 characters"),
    ({"source": "fr"}, KEY, 400, "source language 'fr' is not supported"),
    ({"source": "auto"}, KEY, 400, "source language 'auto' is not supported"),
    ({"target": "es"}, KEY, 400, "target language 'es' is not supported"),
    ({"q": ["a", "b"]}, KEY, 400, "q must be a string"),
])
def test_the_key_the_char_limit_and_the_languages_apply_as_for_translate(server, database, fields, key, status,
                                                                         message):
    before = len(rows(database))
    answer_status, answer = post(server, "suggest", {"q": SENTENCE, "s": "x", "source": "de", "target": "en",
                                                     **fields}, key=key)
    assert answer_status == status and message in answer["error"], answer
    assert len(rows(database)) == before and "Traceback" not in server.stderr()


def test_a_corrupt_database_is_one_line_at_start(tiny_model, tmp_path):
    path = tmp_path / "bad.db"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(Exception, match="cannot use .*bad.db as the suggestions database"):
        with bench_serve.Server(serve_flags(tiny_model, "--suggestions", str(path)), start_timeout=120):
            pass


# ---------------------------------------------------------------- nothing acknowledged is lost
def send_suggestions(server, client, acknowledged, errors):
    """Sends 500 distinct suggestions on one connection, every other one with the page's translation; adds the
    numbers answered 200 to acknowledged, stops at the first connection error."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    for k in range(500):
        number = client * 500 + k
        fields = {"q": "Die Zahl ist %d." % number, "s": "The number is %d." % number, "source": "de",
                  "target": "en", **({"translation": "shown %d" % number} if k % 2 else {})}
        try:
            connection.request("POST", "/suggest", json.dumps(fields), {"Content-Type": "application/json"})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            return
        if response.status == 200 and json.loads(body) == {"success": True}:
            acknowledged.add(number)
        else:
            errors.append((response.status, body))


def test_every_acknowledged_suggestion_survives_a_sigkill(tiny_model, tmp_path):
    database = str(tmp_path / "killed.db")
    flags = serve_flags(tiny_model, "--suggestions", database)
    acknowledged, errors = set(), []
    with bench_serve.Server(flags) as running:
        threads = [threading.Thread(target=send_suggestions, args=(running, client, acknowledged, errors))
                   for client in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(random.uniform(1, 3))
        running.process.kill()  # SIGKILL: no shutdown of any kind
        for thread in threads:
            thread.join()
    assert 0 < len(acknowledged) < 4000 and not errors, errors[:3]  # killed mid-stream
    with bench_serve.Server(flags) as restarted:  # the database opens again after the kill
        stored = {int(q.split()[-1][:-1]) for (q,) in rows(database, "SELECT q FROM suggestions")}
        assert restarted.process.poll() is None
    assert acknowledged <= stored, sorted(acknowledged - stored)[:5]
    assert rows(database, "PRAGMA integrity_check") == [("ok",)]


# ---------------------------------------------------------------- the memory
def test_the_memory_answers_a_normalised_match_and_the_model_the_rest(server, database):
    q, other = "Er zählt bis elf.", "Heute ist der erste Mai."
    model_answer = translated(server, [q, other])
    assert model_answer["memory"] == [False, False]
    Store(database).remember(q, "He counts to eleven.", "de", "en")  # another connection, no restart
    answer = translated(server, ["  Er  zählt bis\telf. ", other])
    assert answer["translatedText"] == ["He counts to eleven.", model_answer["translatedText"][1]]
    assert answer["memory"] == [True, False] and answer["confidence"][0] == 1.0
    single = translated(server, q)
    assert (single["translatedText"], single["memory"]) == ("He counts to eleven.", True)
    # another direction's pair, or a prefix, leaves the item to the model
    Store(database).remember(other, "Aujourd'hui c'est le premier mai.", "de", "fr")
    assert translated(server, other) == {"translatedText": model_answer["translatedText"][1],
                                         "confidence": model_answer["confidence"][1], "memory": False}
    status, prefixed = post(server, "translate", {"q": q, "source": "de", "target": "en", "prefix": "He"})
    assert status == 200 and prefixed["memory"] is False


def test_accepted_suggestions_and_imported_pairs_feed_the_memory_without_a_restart(server, database, tmp_path,
                                                                                 capsys):
    q = "Die Zahl ist elf."
    assert translated(server, q)["memory"] is False
    assert post(server, "suggest", {"q": q, "s": "The number is eleven.", "source": "de", "target": "en"})[0] == 200
    assert translated(server, q)["memory"] is False  # a suggestion is not a pair until accepted
    assert suggestions.main(["list", "--db", database, "--status", "new"]) == 0
    line = [line for line in capsys.readouterr().out.splitlines() if line.endswith(q + " ||| The number is eleven.")]
    assert line and line[0].split("\t")[1:3] == ["new", "de->en"]
    assert suggestions.main(["accept", "--db", database, line[0].split("\t")[0]]) == 0
    assert translated(server, q) == {"translatedText": "The number is eleven.", "confidence": 1.0, "memory": True}
    (tmp_path / "pairs.de").write_text("Zwei Katzen.\nDrei Hunde.\n\n", encoding="utf-8")
    (tmp_path / "pairs.en").write_text("Two cats.\nThree dogs.\nnothing\n", encoding="utf-8")
    assert suggestions.main(["import", str(tmp_path / "pairs.de"), str(tmp_path / "pairs.en"), "--db", database,
                             "--source", "de", "--target", "en"]) == 0
    assert "imported 2 pairs de->en" in capsys.readouterr().out
    assert translated(server, ["Drei Hunde.", "Zwei Katzen."])["translatedText"] == ["Three dogs.", "Two cats."]


def test_the_commands_explain_themselves_and_refuse_bad_input_in_one_line(tmp_path):
    import subprocess
    database = str(tmp_path / "c.db")

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "toolkit.serving.suggestions", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr
    code, out, _ = run("--help")
    assert code == 0 and all(command in out for command in ("import", "accept", "list"))
    for command in ("import", "accept", "list"):
        assert "--db" in run(command, "--help")[1]
    (tmp_path / "a").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "b").write_text("one\n", encoding="utf-8")
    for args, message in ((("import", str(tmp_path / "a"), str(tmp_path / "b"), "--db", database, "--source",
                            "de", "--target", "en"), "has 2 lines"),
                          (("accept", "--db", database, "7"), "no suggestion with id 7"),
                          (("accept", "--db", database), "ids or --all")):
        code, _, err = run(*args)
        assert code == 2 and err.count("\n") == 1 and message in err, err


# ---------------------------------------------------------------- the swap
@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    """{name: logdir}: the tiny model, one trained 20 steps more from it (it translates PROBES otherwise), a copy
    of that one marked rejected, and a model of another vocabulary."""
    import train
    logdir, data_dir = tiny_model
    root = tmp_path_factory.mktemp("models")
    newer = str(root / "newer")
    assert train.main(["--init_from", logdir, "--data_dir", data_dir, "--logdir", newer, "--max_steps", "20",
                       "--batch_size", "2000", "--lr", "0.02", "--warmup_steps", "5", "--eval_every", "100",
                       "--dropout_rate", "0", "--test_batch_size", "256", "--maxlen1", str(TINY_MODEL_MAXLEN1),
                       "--precision", "fp32"]) == 0
    rejected = str(root / "rejected")
    shutil.copytree(newer, rejected)
    mark_rejected(rejected, "held-out BLEU fell", "keep serving the old model")
    import prepro
    other_data = str(root / "other_data")
    assert prepro.main(["--dataset", "numbers", "--n_train", "300", "--n_eval", "10", "--n_test", "10",
                        "--vocab_size", "150", "--data_dir", other_data]) == 0
    other = str(root / "other_vocabulary")
    assert train.main(["--data_dir", other_data, "--logdir", other, "--max_steps", "2", "--d_model", "32",
                       "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "500",
                       "--eval_every", "100", "--maxlen1", str(TINY_MODEL_MAXLEN1), "--precision", "fp32"]) == 0
    return {"tiny": logdir, "newer": newer, "rejected": rejected, "other": other}


def translations_of(logdir, data_dir, tmp_path):
    """translate.py's greedy translations of PROBES with the model of logdir."""
    output = str(tmp_path / ("%s.txt" % os.path.basename(logdir)))
    assert translate.main(["--logdir", logdir, "--data_dir", data_dir, "--beam_size", "1", "--no_split",
                           "--output", output, *PROBES]) == 0
    with open(output, encoding="utf-8") as lines:
        return lines.read().splitlines()


class Clients:
    """8 threads translating PROBES in a loop on keep-alive connections until stopped: every status seen."""

    def __init__(self, server):
        self.server, self.statuses, self.running = server, [], True
        self.threads = [threading.Thread(target=self.client, args=(k,)) for k in range(8)]
        for thread in self.threads:
            thread.start()

    def client(self, k):
        connection = http.client.HTTPConnection(self.server.host, self.server.port, timeout=120)
        while self.running:
            body = json.dumps({"q": PROBES[k % len(PROBES)], "source": "de", "target": "en", "api_key": KEY})
            try:
                connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                self.statuses.append(response.status)
            except (OSError, http.client.HTTPException) as error:
                self.statuses.append(repr(error))

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join()
        return self.statuses


def wait_for_line(server, text, seen, timeout=120):
    """Waits until the server's standard error holds text more than `seen` times."""
    deadline = time.monotonic() + timeout
    while server.stderr().count(text) <= seen:
        assert time.monotonic() < deadline, server.stderr()[-2000:]
        time.sleep(0.2)


def test_a_model_swapped_in_under_load_serves_the_next_requests_and_none_fails(models, tiny_model, tmp_path):
    data_dir = tiny_model[1]
    old, new = (translations_of(models[name], data_dir, tmp_path) for name in ("tiny", "newer"))
    assert old != new  # the two models tell apart
    reload_file = tmp_path / "serve_this"
    with bench_serve.Server(serve_flags(tiny_model, "--api_key", KEY, "--reload_file", str(reload_file))) as server:
        assert translated(server, PROBES)["translatedText"] == old
        clients = Clients(server)
        time.sleep(1)
        status, answer = post(server, "admin/reload", {"logdir": models["newer"]})
        assert status == 200 and answer["model"].startswith(models["newer"] + "@"), answer
        assert translated(server, PROBES)["translatedText"] == new  # answered once the new model serves
        time.sleep(1)
        reload_file.write_text(models["tiny"] + "\n", encoding="utf-8")
        server.process.send_signal(signal.SIGHUP)
        wait_for_line(server, "now serving %s@" % models["tiny"], 0)
        assert translated(server, PROBES)["translatedText"] == old
        time.sleep(1)
        statuses = clients.stop()
        assert len(statuses) > 20 and set(statuses) == {200}, [s for s in statuses if s != 200][:5]
        # without the file, SIGHUP reloads the served logdir's newest checkpoint
        reload_file.unlink()
        server.process.send_signal(signal.SIGHUP)
        wait_for_line(server, "now serving %s@" % models["tiny"], 1)
        assert "Traceback" not in server.stderr()


def test_a_rejected_or_other_vocabulary_logdir_is_refused_and_the_old_model_keeps_serving(models, tiny_model,
                                                                                        tmp_path, plain_server):
    reload_file = tmp_path / "serve_this"
    with bench_serve.Server(serve_flags(tiny_model, "--api_key", KEY, "--reload_file", str(reload_file))) as server:
        before = translated(server, PROBES)["translatedText"]
        for name, message in (("rejected", "is marked rejected"), ("other", "another sentencepiece model")):
            status, answer = post(server, "admin/reload", {"logdir": models[name]})
            assert status == 400 and message in answer["error"] and "still serving" in answer["error"], answer
        assert post(server, "admin/reload", {"logdir": str(tmp_path / "none")})[0] == 400
        assert post(server, "admin/reload", {})[1]["error"].startswith("Invalid request: missing logdir")
        assert post(server, "admin/reload", {"logdir": models["newer"]}, key="wrong")[0] == 403
        reload_file.write_text(models["rejected"] + "\n", encoding="utf-8")
        server.process.send_signal(signal.SIGHUP)
        wait_for_line(server, "SIGHUP: cannot serve", 0)
        assert "is marked rejected" in server.stderr().splitlines()[-1]
        assert translated(server, PROBES)["translatedText"] == before
        assert "Traceback" not in server.stderr()
    # a server without --api_key takes no admin request
    status, answer = post(plain_server, "admin/reload", {"logdir": models["newer"]}, key="")
    assert status == 403 and "--api_key" in answer["error"]


class NamedTranslator:
    """A translator whose result of a source is (its name, the source's length); records when it is closed."""
    batch_size = 8

    def __init__(self, name, delay=0.0):
        self.name, self.delay, self.closed, self.batches = name, delay, False, 0

    def run(self, sources, with_attention=True, settings=None, n=None, prefixes=None):
        assert not self.closed
        time.sleep(self.delay)
        self.batches += 1
        return [(self.name, len(source)) for source in sources]

    def close(self):
        self.closed = True


def test_the_batcher_runs_jobs_queued_before_a_swap_on_the_old_model_and_then_closes_it():
    old, new = NamedTranslator("old", delay=0.3), NamedTranslator("new")
    batcher = Batcher(old, batch_size=8, wait=0, queue_size=8, timeout=9, name="old@1")
    before = [batcher.submit([[1] * k], False) for k in (1, 2, 3)]
    batcher.swap(new, "new@2")
    after = [batcher.submit([[1] * k], False) for k in (4, 5)]
    assert [future.result(10) for future in before] == [[("old", 1)], [("old", 2)], [("old", 3)]]
    assert [future.result(10) for future in after] == [[("new", 4)], [("new", 5)]]
    assert old.closed and not new.closed and batcher.model.name == "new@2"
    batcher.stop()
    idle = NamedTranslator("idle")
    batcher = Batcher(idle, batch_size=8, wait=0, queue_size=8, timeout=9)
    batcher.swap(NamedTranslator("next"), "next")
    assert idle.closed  # no job left: closed at once
    batcher.stop()
