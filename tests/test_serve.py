"""serve.py: LibreTranslate's API driven by a LibreTranslate client (libretranslatepy) and plain JSON posts against
a real server process on the session's tiny model; its translations are translate.py's. Also the html splitting
and the batching worker alone, the queue limit (429), SIGTERM finishing the work in flight, flag errors, and
scripts/bench_serve.py's report."""
import asyncio
import json
import math
import os
import random
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import sentencepiece as spm
from libretranslatepy import LibreTranslateAPI

import decoding
import serve
import translate
from toolkit.translating import documents
from toolkit.translating import sentences
from toolkit.serving.batcher import Batcher
from in_process import run_in_process
from model_fixtures import TINY_MODEL_MAXLEN1

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_serve  # noqa: E402

#: Not ASCII: the right key works all the same.
KEY = "sécret kéy ✓"
SENTENCE = "Heute ist der zweite Oktober zweitausendeinundvierzig."
#: Over the tiny model's 19 pieces: translated in parts, as translate.py does.
LONG = "Heute ist der erste Mai. Die Zahl ist sechshundertneunundneunzig. Er zählt bis elf."
SENTENCES = [SENTENCE, "Die Zahl ist sechshundertneunundneunzig.", "", LONG, "der neunte September"]
CHAR_LIMIT, MAX_SENTENCES = 300, 12
FLAGS = ["--beam_size", "4"]
#: The API tests' server translates a line whole, as translate.py --no_split does beside it (translate_py); the
#: default splits it into sentences.
SERVE_FLAGS = FLAGS + ["--no_split"]


@pytest.fixture(scope="module")
def ct2_model(tiny_model, tmp_path_factory):
    """The tiny model exported by export.py --format ctranslate2 (float32)."""
    pytest.importorskip("ctranslate2")
    import export
    directory = str(tmp_path_factory.mktemp("ct2") / "model")
    assert export.main(["--logdir", tiny_model[0], "--export_dir", directory, "--format", "ctranslate2"]) == 0
    return directory


@pytest.fixture(scope="module", params=["tensorflow", "ctranslate2"])
def server(request, tiny_model):
    """The server of the API tests, on each engine: the checkpoint, and its CTranslate2 export."""
    logdir, data_dir = tiny_model
    engine = ["--engine", "ctranslate2", "--model", request.getfixturevalue("ct2_model")] \
        if request.param == "ctranslate2" else []
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, *SERVE_FLAGS, "--api_key", KEY, "--char_limit",
                             str(CHAR_LIMIT), "--max_sentences", str(MAX_SENTENCES), *engine]) as running:
        running.engine, running.engine_flags = request.param, engine
        yield running


def needs_attention(server):
    if server.engine != "tensorflow":
        pytest.skip("attention needs --engine tensorflow")


@pytest.fixture(scope="module")
def client(server):
    return LibreTranslateAPI(server.url, api_key=KEY)


def post(server, path, fields, key=KEY):
    """(status, answer) of a JSON post."""
    body = json.dumps({**fields, **({"api_key": key} if key else {})}).encode()
    request = urllib.request.Request(server.url + path, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def translate_py(directory, logdir, data_dir, sentences, *flags):
    """translate.py's output lines for sentences (through --output, in directory)."""
    output = os.path.join(directory, "translations.txt")
    assert translate.main(["--logdir", logdir, "--data_dir", data_dir, *SERVE_FLAGS, *flags, "--output", output,
                           *sentences]) == 0
    with open(output, encoding="utf-8") as lines:
        return lines.read().splitlines()


def nbest_of(directory, tiny_model, *flags):
    """translate.py --nbest 4 of SENTENCE alone: [(text, score)], best first."""
    lines = translate_py(directory, *tiny_model, [SENTENCE], "--nbest", "4", *flags)
    return [(text, float(score)) for _, text, score, _ in (line.split(" ||| ") for line in lines)]


@pytest.fixture(scope="module")
def tf_nbest(tiny_model, tmp_path_factory):
    return nbest_of(tmp_path_factory.mktemp("nbest"), tiny_model)


@pytest.fixture
def nbest(server, tf_nbest, tiny_model, tmp_path):
    """The n-best of the server's engine (CTranslate2's beam search scores its entries its own
    way: its translations are translate.py --engine ctranslate2's)."""
    return nbest_of(tmp_path, tiny_model, *server.engine_flags) if server.engine_flags else tf_nbest


# ---------------------------------------------------------------- the API against translate.py
def test_a_string_is_translated_as_translate_py_does(client, nbest):
    assert client.translate(SENTENCE, "de", "en") == nbest[0][0]


def test_a_list_is_translated_in_order_as_translate_py_does(server, tiny_model, tmp_path):
    status, answer = post(server, "translate", {"q": SENTENCES, "source": "de", "target": "en"})
    assert status == 200
    assert answer["translatedText"] == translate_py(tmp_path, *tiny_model, SENTENCES, *server.engine_flags)
    assert answer["translatedText"][2] == ""


def test_alternatives_and_the_page_s_nbest_are_translate_py_s(server, nbest):
    status, answer = post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en", "alternatives": 2})
    assert status == 200
    assert (answer["translatedText"], answer["alternatives"]) == (nbest[0][0], [text for text, _ in nbest[1:3]])
    needs_attention(server)
    status, answer = post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en", "attention": True})
    assert [entry["text"] for entry in answer["nbest"]] == [text for text, _ in nbest]
    assert [entry["score"] for entry in answer["nbest"]] == pytest.approx([score for _, score in nbest], abs=1e-3)


def test_attention_has_a_row_per_target_piece_summing_to_one(server, tiny_model):
    needs_attention(server)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tiny_model[1], "bpe.model"))
    parts, _ = sentences.prepare(LONG, sp, TINY_MODEL_MAXLEN1 - 1)
    status, answer = post(server, "translate", {"q": LONG, "source": "de", "target": "en", "attention": True})
    assert status == 200 and len(parts) > 1
    assert [entry["source"] for entry in answer["attention"]] == [
        [sp.id_to_piece(i) for i in source] for source in parts]
    for entry in answer["attention"]:
        assert entry["source"][-1] == entry["target"][-1] == "</s>"
        assert len(entry["weights"]) == len(entry["target"])
        for row in entry["weights"]:
            assert len(row) == len(entry["source"]) and sum(row) == pytest.approx(1, abs=1e-2)


def test_the_ctranslate2_engine_refuses_attention_with_the_reason(server):
    if server.engine == "tensorflow":
        pytest.skip("the TensorFlow engine has attention")
    status, answer = post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en", "attention": True})
    assert status == 400 and "--engine tensorflow" in answer["error"]


def test_html_keeps_tags_and_translates_each_text_run(server):
    first, second = SENTENCES[:2]
    status, texts = post(server, "translate", {"q": [first, second], "source": "de", "target": "en"})
    status, answer = post(server, "translate", {
        "q": '<p title="Zahl &amp; Datum">%s <b>%s</b></p>\n<br/><!-- kept -->' % (first, second),
        "source": "de", "target": "en", "format": "html"})
    assert status == 200
    assert answer["translatedText"] == '<p title="Zahl &amp; Datum">%s <b>%s</b></p>\n<br/><!-- kept -->' % tuple(
        texts["translatedText"])


def test_source_auto_and_detect_name_the_language_langdetect_finds(server, client, nbest):
    status, answer = post(server, "translate", {"q": SENTENCE, "source": "auto", "target": "en"})
    assert answer["detectedLanguage"]["language"] == "de" and answer["detectedLanguage"]["confidence"] > 90
    assert answer["translatedText"] == nbest[0][0]
    status, answer = post(server, "translate", {"q": [SENTENCE, SENTENCE], "source": "auto", "target": "en"})
    assert [found["language"] for found in answer["detectedLanguage"]] == ["de", "de"]
    assert client.detect(SENTENCE)[0]["language"] == "de"
    assert client.detect("The weather is very nice today, and we go for a walk.")[0]["language"] == "en"
    status, answer = post(server, "translate", {"q": "The weather is very nice today, and we go for a walk.",
                                                "source": "auto", "target": "en"})
    assert status == 400 and "English (en) is not supported" in answer["error"]
    assert client.languages() == [{"code": "de", "name": "German", "targets": ["en"]},
                                  {"code": "en", "name": "English", "targets": []}]


@pytest.mark.parametrize("fields, status, message", [
    ({"q": SENTENCE, "source": "fr", "target": "en"}, 400, "source language 'fr' is not supported"),
    ({"q": SENTENCE, "source": "de", "target": "es"}, 400, "target language 'es' is not supported"),
    ({"q": "", "source": "de", "target": "en"}, 400, "missing q"),
    ({"q": [SENTENCE, 3], "source": "de", "target": "en"}, 400, "q must be a string or a list of strings"),
    ({"q": "x" * (CHAR_LIMIT + 1), "source": "de", "target": "en"}, 400, "--char_limit"),
    ({"q": ["eins"] * (MAX_SENTENCES + 1), "source": "de", "target": "en"}, 400, "--max_sentences"),
    ({"q": SENTENCE, "source": "de", "target": "en", "format": "pdf"}, 400, "format 'pdf'"),
    ({"q": SENTENCE, "source": "de", "target": "en", "alternatives": 4}, 400, "--max_alternatives"),
    ({"q": [SENTENCE], "source": "de", "target": "en", "attention": True}, 400, "q to be one string"),
])
def test_bad_requests_are_refused_with_the_reason(server, fields, status, message):
    answer_status, answer = post(server, "translate", fields)
    assert answer_status == status and message in answer["error"]


def test_char_limit_counts_each_item(server):
    status, answer = post(server, "translate", {"q": ["eins " * 36] * 2, "source": "de", "target": "en"})
    assert status == 200 and len(answer["translatedText"]) == 2


def test_a_second_client_library_deep_translator_works(server, nbest):
    from deep_translator import LibreTranslator
    translator = LibreTranslator(source="de", target="en", api_key=KEY, custom_url=server.url)
    assert translator.translate(SENTENCE) == nbest[0][0]


def test_frontend_settings_has_libretranslate_s_fields(server):
    with urllib.request.urlopen(server.url + "frontend/settings") as response:
        settings = json.loads(response.read())
    assert settings["charLimit"] == CHAR_LIMIT and settings["keyRequired"] is True
    assert settings["supportedFilesFormat"] == [".html", ".txt"] and settings["filesTranslation"] is True
    assert settings["language"] == {"source": {"code": "de", "name": "German"},
                                    "target": {"code": "en", "name": "English"}}
    assert {"frontendTimeout", "apiKeys", "suggestions"} <= set(settings)


def test_translate_file_answers_a_download_url_for_txt_and_html_and_refuses_others(server):
    import requests
    first, second = SENTENCES[:2]
    texts = post(server, "translate", {"q": [first, second], "source": "de", "target": "en"})[1]["translatedText"]
    for name, content, expected in (("a.txt", "%s\n%s\n" % (first, second), "%s\n%s\n" % tuple(texts)),
                                    ("b.html", "<p>%s</p><p>%s</p>" % (first, second),
                                     "<p>%s</p><p>%s</p>" % tuple(texts))):
        answer = requests.post(server.url + "translate_file", files={"file": (name, content.encode())},
                               data={"source": "de", "target": "en", "api_key": KEY}, timeout=60)
        assert answer.status_code == 200, answer.text
        download = requests.get(answer.json()["translatedFileUrl"], timeout=60)
        assert download.text == expected and name in download.headers["Content-Disposition"]
    answer = requests.post(server.url + "translate_file", files={"file": ("c.pdf", b"%PDF")},
                           data={"source": "de", "target": "en", "api_key": KEY}, timeout=60)
    assert answer.status_code == 400 and ".html, .txt" in answer.json()["error"]
    answer = requests.post(server.url + "translate_file", files={"file": ("empty.txt", b" \n")},
                           data={"source": "de", "target": "en", "api_key": KEY}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"] == (
        "Invalid request: the file 'empty.txt' is empty: nothing to translate")


def preflight(server, origin):
    request = urllib.request.Request(server.url + "translate", method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    with urllib.request.urlopen(request) as response:
        return response.status, response.headers


def test_a_browser_preflight_gets_the_cors_headers(server):
    status, headers = preflight(server, "https://page.example")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "content-type"
    request = urllib.request.Request(server.url + "languages", headers={"Origin": "https://page.example"})
    with urllib.request.urlopen(request) as response:
        assert response.headers["Access-Control-Allow-Origin"] == "*"


@pytest.fixture(scope="module")
def default_beam_server(tiny_model):
    """serve.py at the default --beam_size 1, at most 2 alternatives, CORS for one origin."""
    logdir, data_dir = tiny_model
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, "--max_alternatives", "2",
                             "--cors_origins", "https://one.example"]) as running:
        yield running


def test_alternatives_at_the_default_beam_widen_the_request_s_beam(default_beam_server, tiny_model, tmp_path):
    lines = translate_py(tmp_path, *tiny_model, [SENTENCE], "--beam_size", "3", "--nbest", "3")
    beam3 = [line.split(" ||| ")[1] for line in lines]
    status, answer = post(default_beam_server, "translate",
                          {"q": SENTENCE, "source": "de", "target": "en", "alternatives": 2}, key="")
    assert status == 200 and [answer["translatedText"], *answer["alternatives"]] == beam3
    greedy = translate_py(tmp_path, *tiny_model, [SENTENCE], "--beam_size", "1")
    assert post(default_beam_server, "translate", {"q": SENTENCE, "source": "de", "target": "en"},
                key="")[1]["translatedText"] == greedy[0]
    status, answer = post(default_beam_server, "translate",
                          {"q": SENTENCE, "source": "de", "target": "en", "alternatives": 3}, key="")
    assert status == 400 and "--max_alternatives" in answer["error"]


def test_a_three_sentence_paragraph_comes_back_as_three_translated_sentences_with_its_spacing(
        default_beam_server):
    sentences = ["Heute ist der erste Mai.", "Die Zahl ist elf.", "Er zählt bis drei."]
    status, alone = post(default_beam_server, "translate", {"q": sentences, "source": "de", "target": "en"},
                         key="")
    assert status == 200 and all(alone["translatedText"])
    paragraph = " %s  %s\t%s\n" % tuple(sentences)
    status, answer = post(default_beam_server, "translate", {"q": paragraph, "source": "de", "target": "en"},
                          key="")
    assert status == 200
    assert answer["translatedText"] == " %s  %s\t%s\n" % tuple(alone["translatedText"])
    assert default_beam_server.stderr().splitlines()[-1].startswith("POST /translate 200 3 sentences")


#: Above spaCy's limit of 1,000,000 characters.
BIG_CHAR_LIMIT = 1_100_000


@pytest.fixture(scope="module")
def big_limit_server(tiny_model):
    """serve.py splitting sentences (the default), with a --char_limit above spaCy's limit."""
    logdir, data_dir = tiny_model
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, "--char_limit", str(BIG_CHAR_LIMIT)]) \
            as running:
        yield running


def timed_get(server, path):
    """Seconds until GET path is answered (200) on a new connection."""
    start = time.monotonic()
    with urllib.request.urlopen(server.url + path, timeout=120) as response:
        assert response.status == 200
        response.read()
    return time.monotonic() - start


def test_long_requests_leave_languages_answering_and_a_text_over_spacy_s_limit_is_a_4xx(big_limit_server):
    """5,000 characters of punctuation (spaCy's tokenizer took seconds on them, on the event loop) and a request at
    the character limit, above spaCy's own: /languages answers within its usual time all along."""
    usual = max(timed_get(big_limit_server, "languages") for _ in range(5))
    long_requests = {"punctuation": ".," * 2500, "at the limit": ("Ein Satz. " * BIG_CHAR_LIMIT)[:BIG_CHAR_LIMIT]}
    answers, done = {}, []

    def ask(name):
        answers[name] = post(big_limit_server, "translate", {"q": long_requests[name], "source": "de",
                                                             "target": "en"}, key="")
        done.append(time.monotonic())

    threads = [threading.Thread(target=ask, args=(name,)) for name in long_requests]
    for thread in threads:
        thread.start()
    waits = []
    while len(done) < len(threads):
        waits.append((timed_get(big_limit_server, "languages"), time.monotonic()))
    for thread in threads:
        thread.join()
    assert all(status < 500 for status, _ in answers.values()), answers
    assert answers["at the limit"][0] == 400 and "--max_sentences" in answers["at the limit"][1]["error"]
    assert "Traceback" not in big_limit_server.stderr()
    # some /languages answers came while the long requests were being worked on, each within its usual time
    assert waits and waits[0][1] < max(done)
    assert max(wait for wait, _ in waits) < usual + 1.5, (usual, sorted(waits)[-3:])


def test_cors_origins_allows_the_origins_named_only(default_beam_server):
    assert preflight(default_beam_server, "https://one.example")[1]["Access-Control-Allow-Origin"] \
        == "https://one.example"
    assert "Access-Control-Allow-Origin" not in preflight(default_beam_server, "https://two.example")[1]


def test_a_wrong_api_key_is_403_and_the_client_sees_400_for_a_wrong_language(server, client):
    assert post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en"}, key="")[0] == 403
    assert post(server, "detect", {"q": SENTENCE}, key="wrong")[0] == 403
    with pytest.raises(urllib.error.HTTPError) as error:
        client.translate(SENTENCE, "en", "de")
    assert error.value.code == 400


def test_one_log_line_per_request(server):
    post(server, "translate", {"q": [SENTENCE, LONG], "source": "de", "target": "en"})
    assert server.stderr().splitlines()[-1].startswith("POST /translate 200 3 sentences ")  # LONG is 2


def test_admin_reload_swaps_the_checkpoint_in_and_the_ctranslate2_engine_refuses_in_one_line(server, client, nbest,
                                                                                             tiny_model):
    status, answer = post(server, "admin/reload", {"logdir": tiny_model[0]})
    if server.engine == "ctranslate2":
        assert status == 400 and "the ctranslate2 engine cannot swap its model" in answer["error"]
    else:
        assert status == 200 and answer["model"].startswith(tiny_model[0] + "@")
    assert client.translate(SENTENCE, "de", "en") == nbest[0][0]  # the same weights, or the old model
    assert post(server, "admin/reload", {"logdir": tiny_model[0]}, key="wrong")[0] == 403


# ---------------------------------------------------------------- the front door
def send(server, raw, timeout=30, drop=False):
    """Sends raw bytes (a whole HTTP request, or its start when drop) on a new connection; (status
    or None, body bytes), or (None, b"") at once when drop."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as connection:
        connection.sendall(raw)
        answer = b""
        if drop:
            return None, answer
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/") else None
    return (int(status) if status else None), body


def http(path, body, content_type, method="POST", extra=b""):
    """An HTTP/1.1 request with body, its Content-Length and Connection: close."""
    return (b"%s /%s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s"
            b"Connection: close\r\n\r\n" % (method.encode(), path.encode(), content_type,
                                           len(body), extra) + body)


def fields_json(**extra):
    return json.dumps({"q": SENTENCE, "source": "de", "target": "en", "api_key": KEY,
                       **extra}).encode()


BOUNDARY = b"b0und4ry"


def multipart_body(file_name=None, content=SENTENCE.encode(), part_headers=b"", key=KEY):
    """A multipart form of source de, target en, api_key and q (content; part_headers added to its part), or with
    file_name (the Content-Disposition parameter as sent, e.g. b'filename="a.txt"') a file part instead."""
    def part(disposition, body, extra=b""):
        return b"--%s\r\nContent-Disposition: form-data; %s\r\n%s\r\n%s\r\n" % (BOUNDARY, disposition, extra, body)
    last = part(b'name="file"; ' + file_name, content, b"Content-Type: text/plain\r\n" + part_headers) if file_name \
        else part(b'name="q"', content, part_headers)
    return (part(b'name="source"', b"de") + part(b'name="target"', b"en")
            + part(b'name="api_key"', key.encode()) + last + b"--%s--\r\n" % BOUNDARY)


MALFORMED = {
    "json nested 20,000 deep": (b"application/json", b'{"q": ' + b"[" * 20000 + b"]" * 20000 + b"}",
                                400, "nested too deep"),
    "json nested in a field": (b"application/json", fields_json(q=[["x"]]), 400, "'q' holds a list inside a list"),
    "an object as q": (b"application/json", fields_json(q={"a": 1}), 400, "'q' holds an object"),
    "alternatives superscript two": (b"application/x-www-form-urlencoded",
                                     "q=eins&source=de&target=en&alternatives=²&api_key="
                                     .encode() + urllib.parse.quote(KEY).encode(),
                                     400, "alternatives must be a whole number"),
    "alternatives of 5000 digits": (b"application/json", fields_json(alternatives="9" * 5000),
                                    400, "alternatives must be a whole number"),
    "lone surrogate in q": (b"application/json", fields_json().replace(b'"q": "', b'"q": "\\ud800'),
                            400, "not valid Unicode"),
    "form with invalid utf-8": (b"application/x-www-form-urlencoded", b"q=\xff\xfe&source=de",
                                400, "not valid"),
    "form escape of invalid utf-8": (b"application/x-www-form-urlencoded", b"q=%ff%fe&source=de",
                                     400, "form body cannot be read"),
    "multipart without boundary": (b"multipart/form-data", b"--x\r\n\r\nq\r\n--x--\r\n", 400,
                                   "multipart body cannot be read"),
    "a part in an unknown transfer encoding": (
        b"multipart/form-data; boundary=" + BOUNDARY,
        multipart_body(part_headers=b"Content-Transfer-Encoding: x-klingon\r\n"), 400, "x-klingon"),
    "a file part in an unknown transfer encoding": (
        b"multipart/form-data; boundary=" + BOUNDARY,
        multipart_body(b'filename="a.txt"', part_headers=b"Content-Transfer-Encoding: x-klingon\r\n"), 400,
        "x-klingon"),
    "a raw NUL in a part's header": (b"multipart/form-data; boundary=" + BOUNDARY,
                                     multipart_body(b'filename="a\x00b.txt"'), 400, "multipart body cannot be read"),
    "charset klingon": (b"application/json; charset=klingon", fields_json(), 400,
                        "charset 'klingon' is not supported"),
    "non-ascii api_key from a client": (b"application/json",
                                        fields_json(api_key="schlüssel ✗"), 403, "Invalid API key"),
    "api_key not a string": (b"application/json", fields_json(api_key=[KEY]), 403, "API key"),
    "format not a string": (b"application/json", fields_json(format=7), 400, "format 7"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_are_4xx_with_the_reason_and_no_traceback(server, case):
    content_type, body, status, message = MALFORMED[case]
    answer_status, answer = send(server, http("translate", body, content_type))
    assert answer_status == status and message in json.loads(answer)["error"], server.stderr()[-3000:]
    assert "Traceback" not in server.stderr()


def head(*lines):
    """The start of a request: its request line and header lines, then the blank line."""
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n"


START = b"POST /translate HTTP/1.1", b"Host: x", b"Content-Type: application/json"
#: Requests that aiohttp's parser, or its body reader, refuses before any handler of ours runs.
MALFORMED_HTTP = {
    "an unknown method": (head(b"FOO /translate HTTP/1.1", b"Host: x"), 400, "Invalid method"),
    "a request line of bytes": (head(b"\x00\xff\xfe garbage"), 400, "Invalid method"),
    "a chunk size that is no number": (head(*START, b"Transfer-Encoding: chunked") + b"zz\r\n{}\r\n0\r\n\r\n",
                                       400, "chunk size"),
    "a body longer than its Content-Length": (head(*START, b"Content-Length: 2", b"Connection: close")
                                              + fields_json(), 400, "Invalid request"),
    "a negative Content-Length": (head(*START, b"Content-Length: -5"), 400, "Content-Length"),
    "a Content-Length that is no number": (head(*START, b"Content-Length: abc"), 400, "Content-Length"),
    "Content-Length and chunked both": (head(*START, b"Content-Length: 2", b"Transfer-Encoding: chunked")
                                        + b"{}", 400, "Transfer-Encoding"),
    "a header of 100 KB": (head(*START, b"X-Big: " + b"a" * 100000), 400, "more than"),
    "2,000 headers": (head(*START, *(b"X-%d: 1" % k for k in range(2000))), 400, "headers"),
    "a folded header": (head(*START, b"X-Old: a", b"  folded"), 400, "whitespace"),
    "an expectation other than 100-continue": (
        head(*START, b"Expect: 999-bogus", b"Content-Length: 2", b"Connection: close") + b"{}", 417,
        "Expect '999-bogus' is not supported"),
    "gzip that is not": (head(*START, b"Content-Encoding: gzip", b"Content-Length: %d" % len(fields_json()),
                              b"Connection: close") + fields_json(), 400, "the body cannot be read"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_HTTP))
def test_requests_the_http_parser_refuses_are_4xx_with_a_json_error(server, case):
    raw, status, message = MALFORMED_HTTP[case]
    answer_status, answer = send(server, raw)
    assert answer_status == status and message in json.loads(answer)["error"], (answer, server.stderr()[-3000:])
    assert "Traceback" not in server.stderr()
    assert post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en"})[0] == 200


def test_expect_100_continue_is_answered_and_the_request_translated(server, nbest):
    body = fields_json()
    with socket.create_connection((server.host, server.port), timeout=30) as connection:
        connection.sendall(head(*START, b"Expect: 100-continue", b"Content-Length: %d" % len(body),
                                b"Connection: close"))
        assert connection.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        connection.sendall(body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["translatedText"] == nbest[0][0]


def test_html_with_a_marked_section_keeps_it_and_translates_around_it(server):
    status, answer = post(server, "translate", {"q": "<![foo[bar]]><p>eins</p>", "source": "de",
                                                "target": "en", "format": "html"})
    assert status == 200 and answer["translatedText"].startswith("<![foo[bar]]><p>")


def test_a_64_kb_request_line_and_a_client_gone_mid_body_are_one_log_line_each(server):
    before = len(server.stderr().splitlines())
    status, _ = send(server, b"GET /" + b"a" * 65536 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 400
    body = fields_json()
    send(server, http("translate", body, b"application/json")[:-len(body) // 2], drop=True)
    time.sleep(0.5)
    lines = server.stderr().splitlines()[before:]
    assert len(lines) == 2 and "Traceback" not in server.stderr(), lines
    assert "LineTooLong" in lines[0] and "client disconnected" in lines[1]


#: File names a client may send, as their Content-Disposition parameter: line breaks, NUL and other control
#: characters (RFC 5987 escapes or raw bytes), quotes, backslashes, non-ASCII and a line separator.
FILE_NAMES = {
    "CR LF and a header": b"filename*=UTF-8''a%0D%0AX-Injected%3A%201%0D%0A.txt",
    "a NUL": b"filename*=UTF-8''a%00b.txt",
    "an escape sequence and a tab": b"filename*=UTF-8''a%1B%5B31m%09b.txt",
    "a Windows path": b'filename="C:\\Users\\a b.txt"',
    "quotes and backslashes": b'filename="a\\"b\\\\c\'d.html"',
    "non-ASCII and a line separator": b"filename*=UTF-8''%C3%9Cbung%E2%80%A8zwei.txt",
}


def download(server, url):
    """GET of a translatedFileUrl (its host is the request's Host header: x) from the server."""
    return urllib.request.urlopen(server.url + urllib.parse.urlsplit(url).path.lstrip("/"), timeout=60)


@pytest.mark.parametrize("case", sorted(FILE_NAMES))
def test_an_upload_of_any_file_name_downloads_and_each_request_is_one_log_line(server, case):
    expected = post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en"})[1]["translatedText"]
    before = len(server.stderr().splitlines())
    status, answer = send(server, http("translate_file", multipart_body(FILE_NAMES[case]),
                                       b"multipart/form-data; boundary=" + BOUNDARY))
    assert status == 200, answer
    with download(server, json.loads(answer)["translatedFileUrl"]) as answer:
        assert answer.read().decode("utf-8") == expected
        disposition = answer.headers["Content-Disposition"]
    assert disposition.startswith("attachment; filename=") and disposition.isascii() and disposition.isprintable()
    lines = server.stderr().splitlines()[before:]
    assert len(lines) == 2 and lines[0].startswith("POST /translate_file 200 "), lines
    assert lines[1].startswith("GET /download_file/") and " 200 0 sentences " in lines[1], lines
    assert all(line.isprintable() for line in lines), lines


def test_a_file_name_aiohttp_cannot_parse_is_a_400_and_one_log_line(server):
    before = len(server.stderr().splitlines())
    status, answer = send(server, http("translate_file", multipart_body(b"filename*=UTF-8''a[%0A.txt"),
                                       b"multipart/form-data; boundary=" + BOUNDARY))
    assert status == 400 and "missing file parameter" in json.loads(answer)["error"]
    lines = server.stderr().splitlines()[before:]
    assert len(lines) == 1 and lines[0].startswith("POST /translate_file 400 "), lines


def fuzzed_request(rng, valid):
    """One malformed request: a valid one with bytes flipped, cut, repeated or replaced, sent to a
    path and with a content type drawn from those the server knows and some it does not."""
    body = bytearray(rng.choice(valid))
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(body) + 1)
        move = rng.randrange(5)
        if move == 0:
            body[at:at + 1] = bytes([rng.randrange(256)])
        elif move == 1:
            del body[at:at + rng.randint(1, 20)]
        elif move == 2:
            body[at:at] = rng.choice([b"[", b"{", b'"\\ud800"', b"\xff", b"%ff", b"&", b"=",
                                      b"\\u0000", b"<![x[", b"1e999", b"-1", b"null"]) * rng.randint(1, 50)
        elif move == 3:
            body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 30)))
        else:
            body = body[:at]
    content_type = rng.choice([b"application/json", b"application/json; charset=latin-1",
                               b"application/x-www-form-urlencoded", b"multipart/form-data",
                               b"multipart/form-data; boundary=x", b"text/plain",
                               b"application/json; charset=base64", b"application/json; charset=",
                               b"\xff/\xfe"])
    path = rng.choice(["translate", "detect", "translate?q=%ff", "languages", "nowhere",
                       "translate?alternatives=%C2%B2", "translate_file", "suggest",
                       "admin/reload"])
    if body.startswith(b"--" + BOUNDARY) and rng.random() < 0.8:
        content_type = b"multipart/form-data; boundary=" + BOUNDARY
        path = rng.choice(["translate", "translate_file", "translate_file", "detect"])
    return http(path, bytes(body), content_type, method=rng.choice(["POST"] * 5 + ["GET", "PUT"]))


def test_fuzz_two_thousand_malformed_requests_get_no_5xx_and_it_still_translates(server, nbest):
    rng = random.Random(62)
    valid = [fields_json(), fields_json(format="html", q="<p>eins <b>zwei</b></p>"),
             fields_json(alternatives=2), fields_json(q=["eins", "zwei"], source="auto"),
             fields_json(min_len_b=3, no_repeat_ngram_size=2, prefix="one", min_confidence=0.1),
             b"q=eins&source=de&target=en&min_len_a=0.5&sampling_topp=1&api_key="
             + urllib.parse.quote(KEY).encode(),
             b"q=eins&source=de&target=en&api_key=" + urllib.parse.quote(KEY).encode(),
             multipart_body(), multipart_body(part_headers=b"Content-Transfer-Encoding: base64\r\n",
                                              content=b"ZWlucw=="),
             *(multipart_body(name, b"eins\nzwei") for name in FILE_NAMES.values())]
    statuses = {}
    for _ in range(2000):
        status, body = send(server, fuzzed_request(rng, valid))
        statuses[status] = statuses.get(status, 0) + 1
        assert status is not None and status < 500, body  # an answer, never a dropped connection
        if status == 200 and b"translatedFileUrl" in body:  # the download of any accepted upload works
            with download(server, json.loads(body)["translatedFileUrl"]) as answer:
                assert answer.status == 200
    assert sum(count for status, count in statuses.items() if status and status >= 400) > 1000
    assert post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en"})[1][
        "translatedText"] == nbest[0][0]
    assert "Traceback" not in server.stderr()
    assert all(line.isprintable() for line in server.stderr().splitlines())


# ---------------------------------------------------------------- queue, shutdown, flags
def test_a_full_queue_is_429_and_sigterm_answers_the_request_in_flight(tiny_model, tf_nbest):
    nbest = tf_nbest
    logdir, data_dir = tiny_model
    # the worker waits 3 s for more sentences: the first request stays in the queue that long
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, *FLAGS, "--queue_size", "1",
                             "--batch_wait_ms", "3000"]) as running:
        answers = []

        def ask():
            answers.append(post(running, "translate", {"q": SENTENCE, "source": "de", "target": "en"}, key=""))

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(status for status, _ in answers) == [200] + [429] * 5
        assert nbest[0][0] in [answer.get("translatedText") for _, answer in answers]
        assert "--queue_size" in [answer for status, answer in answers if status == 429][0]["error"]

        thread = threading.Thread(target=ask)
        thread.start()
        time.sleep(1.5)  # in the worker's 3 s wait
        assert running.stop() == 0
        thread.join()
        assert (answers[-1][0], answers[-1][1]["translatedText"]) == (200, nbest[0][0])
        assert "stopped" in running.stderr()


def test_help_explains_every_flag_and_a_bad_logdir_is_one_line(tmp_path, capsys):
    code, out, _ = run_in_process(capsys, "serve.py", serve.main, "--help")
    assert code == 0
    for action in serve.build_parser()._actions:
        assert action.help, action.dest
    for flag in ("--port", "--batch_wait_ms", "--char_limit", "--max_sentences", "--queue_size", "--timeout",
                 "--api_key", "--beam_size", "--ckpt"):
        assert flag in out
    code, _, err = run_in_process(capsys, "serve.py", serve.main, "--logdir", tmp_path / "none")
    assert code == 2 and err.count("\n") == 1 and "hparams.json not found" in err
    for flag, value in (("--queue_size", "0"), ("--batch_wait_ms", "inf"), ("--timeout", "nan")):
        code, _, err = run_in_process(capsys, "serve.py", serve.main, "--logdir", tmp_path, flag, value)
        assert code == 2 and err.count("\n") == 1 and "%s %s is out of range" % (flag, value) in err


# ---------------------------------------------------------------- decoding options of a request
def ask(server, key=KEY, **fields):
    """(status, answer) of /translate of SENTENCE with fields on top."""
    return post(server, "translate", {"q": SENTENCE, "source": "de", "target": "en", **fields}, key=key)


def pieces(tiny_model, text):
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tiny_model[1], "bpe.model"))
    return sp.encode(text, out_type=str)


def forced_log_prob(tmp_path, tiny_model, source, reference):
    """translate.py --score's log p(reference + </s> | source)."""
    src, ref = tmp_path / "score.src", tmp_path / "score.ref"
    src.write_text(source + "\n", encoding="utf-8")
    ref.write_text(reference + "\n", encoding="utf-8")
    lines = translate_py(tmp_path, *tiny_model, [], "--input", str(src), "--score", str(ref))
    return float(lines[0].split("\t")[0])


def test_confidence_is_in_0_1_and_the_tf_engine_s_is_exp_of_log_p_over_tokens(server, tiny_model, tmp_path):
    status, answer = ask(server)
    assert status == 200 and 0 < answer["confidence"] <= 1
    assert answer["confidence"] == round(answer["confidence"], 4)
    status, listed = post(server, "translate", {"q": SENTENCES, "source": "de", "target": "en"})
    assert status == 200 and len(listed["confidence"]) == len(SENTENCES)
    assert all(0 < confidence <= 1 for confidence in listed["confidence"])
    if server.engine == "tensorflow":
        log_prob = forced_log_prob(tmp_path, tiny_model, SENTENCE, answer["translatedText"])
        tokens = len(pieces(tiny_model, answer["translatedText"])) + 1  # with </s>
        assert answer["confidence"] == pytest.approx(math.exp(log_prob / tokens), abs=2e-4)


def test_min_confidence_empties_translated_text_and_still_reports_the_confidence(server):
    plain = ask(server)[1]
    status, answer = ask(server, min_confidence=1.0, alternatives=2)
    assert status == 200 and answer["translatedText"] == "" and answer["confidence"] == plain["confidence"]
    assert answer["alternatives"] == []
    assert ask(server, min_confidence=plain["confidence"] / 2)[1]["translatedText"] == plain["translatedText"]


def test_a_prefix_starts_the_translation_of_its_item(server):
    other = ask(server, q="der neunte September")[1]["translatedText"]
    free = ask(server)[1]["translatedText"]
    prefix = " ".join(other.split()[:2])
    status, answer = ask(server, prefix=prefix)
    assert status == 200 and answer["translatedText"].startswith(prefix) and answer["translatedText"] != free
    status, answer = ask(server, q=[SENTENCE, SENTENCE], prefix=[prefix, ""])
    assert status == 200 and answer["translatedText"][0].startswith(prefix) and answer["translatedText"][1] == free


def test_min_len_lengthens_and_no_repeat_ngram_size_blocks_repeats(server, tiny_model):
    free = pieces(tiny_model, ask(server)[1]["translatedText"])
    for fields in ({"min_len_b": len(free) + 6}, {"min_len_a": 3.0}):
        status, answer = ask(server, **fields)
        assert status == 200 and len(pieces(tiny_model, answer["translatedText"])) > len(free), fields
    status, answer = ask(server, min_len_b=len(free) + 10, no_repeat_ngram_size=2)
    output = pieces(tiny_model, answer["translatedText"])
    bigrams = list(zip(output, output[1:]))
    assert status == 200 and len(output) > len(free) and len(set(bigrams)) == len(bigrams)


def test_repetition_penalty_changes_a_repetitive_output(server, tiny_model):
    """Forced long, the output repeats pieces; a penalty of 100 on pieces already output repeats fewer."""
    def repeats(fields):
        status, answer = ask(server, min_len_b=30, **fields)
        assert status == 200
        output = pieces(tiny_model, answer["translatedText"])
        return len(output) - len(set(output))
    assert repeats({"repetition_penalty": 100}) < repeats({})


@pytest.mark.parametrize("fields, message", [
    ({"sampling_topp": 2}, "sampling_topp 2 is out of range: it must be above 0 and at most 1"),
    ({"min_len_b": -1}, "min_len_b must be a whole number, not -1"),
    ({"min_len_b": 1.5}, "min_len_b must be a whole number"),
    ({"no_repeat_ngram_size": 17}, "no_repeat_ngram_size 17 is out of range: it must be from 0 (off) to 16"),
    ({"repetition_penalty": "abc"}, "repetition_penalty must be a number, not 'abc'"),
    ({"min_len_a": True}, "min_len_a must be a number"),
    ({"sampling_temperature": float("inf")}, "sampling_temperature inf is out of range"),
    ({"min_len_a": 10 ** 400}, "min_len_a "),
    ({"min_confidence": 1.5}, "min_confidence 1.5 is out of range: it must be from 0 to 1"),
    ({"min_confidence": [0.5]}, "min_confidence must be a number"),
    ({"prefix": ["a", "b"]}, "prefix must be a string, or for a list q a list of 1 strings"),
    ({"q": [SENTENCE, SENTENCE], "prefix": ["a"]}, "a list of 2 strings"),
    ({"q": [SENTENCE, SENTENCE], "prefix": 3}, "prefix must be a string"),
    ({"sampling_topk": 3}, "sampling_topk samples one hypothesis at a time: it needs a beam of 1"),
    ({"sampling_temperature": 2.0}, "sampling_temperature shapes the draws of sampling, which sampling_topk 1 turns off"),
])
def test_a_bad_decoding_option_is_a_400_naming_the_field(server, fields, message):
    status, answer = ask(server, **fields)
    assert status == 400 and message in answer["error"], answer


def test_decoding_options_come_as_form_text_too(server, tiny_model):
    def form(**fields):
        body = urllib.parse.urlencode({"q": SENTENCE, "source": "de", "target": "en", "api_key": KEY,
                                       **fields}).encode()
        try:
            with urllib.request.urlopen(server.url + "translate", body, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
    assert form(min_len_b="20", min_len_a="0.0") == ask(server, min_len_b=20)
    status, answer = form(sampling_topp="0.5x")
    assert status == 400 and "sampling_topp must be a number, not '0.5x'" in answer["error"]


@pytest.fixture(scope="module", params=["tensorflow", "ctranslate2"])
def greedy_server(request, tiny_model):
    """serve.py at --beam_size 1 (sampling allowed), on each engine, without an api key."""
    logdir, data_dir = tiny_model
    engine = ["--engine", "ctranslate2", "--model", request.getfixturevalue("ct2_model")] \
        if request.param == "ctranslate2" else []
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, "--beam_size", "1", "--no_split",
                             *engine]) as running:
        yield running


def test_sampling_top_1_and_a_sharp_temperature_are_greedy_and_alternatives_are_samples(greedy_server):
    greedy = ask(greedy_server, key="")[1]
    assert ask(greedy_server, key="", sampling_topk=1)[1] == greedy
    sharp = ask(greedy_server, key="", sampling_topk=0, sampling_temperature=0.01)[1]
    assert sharp["translatedText"] == greedy["translatedText"]
    status, answer = ask(greedy_server, key="", sampling_topk=0, sampling_temperature=2.0, alternatives=3)
    assert status == 200 and len(answer["alternatives"]) == 3 and all(answer["alternatives"])


def test_serve_refuses_an_ensemble_with_the_ctranslate2_engine_in_one_line(tiny_model, ct2_model, capsys):
    code, _, err = run_in_process(capsys, "serve.py", serve.main, "--engine", "ctranslate2", "--model", ct2_model,
                                  "--ensemble", tiny_model[0])
    assert code == 2 and err.count("\n") == 1 and "--ensemble" in err


# ---------------------------------------------------------------- pieces alone
def test_html_runs_are_split_with_entities_decoded_and_rendered_escaped():
    document = documents.Document('<p a="1&amp;2"> x &amp; y<br>z </p><script>if (a < b) go();</script>', "html")
    assert document.segments == ["x & y", "z"]
    assert document.render(["a < b", "c"]) == '<p a="1&amp;2"> a &lt; b<br>c </p><script>if (a < b) go();</script>'
    document = documents.Document("eins\n\nzwei", "text")
    assert document.segments == ["eins", "", "zwei"] and document.render(["one", "", "two"]) == "one\n\ntwo"


class FakeTranslator:
    """Records the batches it runs (source lengths, and whether with the attention pass), each taking `delay`
    seconds; the result of a source is its length."""
    batch_size = 8

    def __init__(self, delay=0.0):
        self.batches, self.options, self.delay = [], [], delay

    def run(self, sources, with_attention=True, settings=None, n=None, prefixes=None):
        time.sleep(self.delay)
        self.batches.append(([len(source) for source in sources], with_attention))
        self.options.append((settings, n, prefixes))
        return [len(source) for source in sources]


def test_the_batcher_runs_jobs_arriving_together_at_once_sorted_and_answers_each_its_own():
    translator = FakeTranslator()
    batcher = Batcher(translator, batch_size=8, wait=1.0, queue_size=4, timeout=9)
    futures = [batcher.submit([[1] * 3, [1] * 1], False), batcher.submit([[1] * 2], True),
               batcher.submit([[1] * 5, [1] * 4], False)]
    assert [future.result(10) for future in futures] == [[3, 1], [2], [5, 4]]
    batcher.stop()
    assert translator.batches == [([1, 3, 4, 5], False), ([2], True)]


def test_the_batcher_groups_jobs_by_settings_n_and_prefixes_and_keeps_prefixes_beside_their_sources():
    translator = FakeTranslator()
    wide = decoding.DecodingSettings(beam_size=3)
    batcher = Batcher(translator, batch_size=8, wait=1.0, queue_size=4, timeout=9)
    futures = [batcher.submit([[1] * 3, [1] * 1], False, wide, 3), batcher.submit([[1] * 2], False),
               batcher.submit([[1] * 5, [1] * 4], False, wide, 3, [[7], []]),
               batcher.submit([[1] * 6], False, wide, 3, [[8, 9]])]
    assert [future.result(10) for future in futures] == [[3, 1], [2], [5, 4], [6]]
    batcher.stop()
    assert translator.batches == [([1, 3], False), ([2], False), ([4, 5, 6], False)]
    assert translator.options == [(wide, 3, None), (None, None, None), (wide, 3, [[], [7], [8, 9]])]


def test_the_batcher_refuses_past_its_queue_and_drops_a_request_past_its_timeout():
    slow = FakeTranslator(delay=1.0)
    batcher = Batcher(slow, batch_size=8, wait=0, queue_size=2, timeout=0.3)

    async def three_requests():
        return await asyncio.gather(*(batcher.translate([[1] * length], False) for length in (1, 2, 3)),
                                    return_exceptions=True)

    first, second, third = asyncio.run(three_requests())
    assert (first.status, second.status, third.status) == (504, 504, 429)
    assert "--timeout of 0.3 s" in str(first) and "--queue_size" in str(third)
    batcher.stop()
    assert slow.batches == [([1], False)]  # the second timed out before the model was free: never run
# ---------------------------------------------------------------- the benchmark
def test_bench_serve_reports_every_level_and_translate_py(tiny_model, capsys):
    logdir, data_dir = tiny_model
    code, out, _ = run_in_process(capsys, "bench_serve.py", bench_serve.main, "--logdir", logdir, "--data_dir",
                                  data_dir, "--input", os.path.join(data_dir, "test.1"), "--seconds", "0.7",
                                  "--clients", "1,4")
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert list(report["engines"]) == ["tensorflow", "ctranslate2"]
    assert report["levels"] == report["engines"]["tensorflow"]["levels"]
    assert [level["clients"] for level in report["engines"]["ctranslate2"]["levels"]] == [1, 4]
    for level in report["engines"]["tensorflow"]["levels"] + report["engines"]["ctranslate2"]["levels"]:
        assert level["requests"] > 0 and level["failed"] == level["rejected_429"] == 0
        assert level["p50_ms"] <= level["p95_ms"]
        assert level["sentences_per_s"] == pytest.approx(level["requests_per_s"], rel=1e-2)
    assert 0 < report["server_rss_mb"]["start"] <= report["server_rss_mb"]["end"] * 2
    for engine in report["engines"].values():
        under_long = engine["languages_under_long_requests"]
        assert under_long["languages_answers"] > 0 and 0 < under_long["languages_usual_ms"]
        assert under_long["languages_slowest_ms"] < under_long["languages_usual_ms"] + 1500
        assert {name: answer["chars"] for name, answer in under_long["long_requests"].items()} == {
            "punctuation_5k": 5000, "at_char_limit": 5000}
        assert all(answer["status"] in (200, 400) for answer in under_long["long_requests"].values())
    assert report["translate_py"]["sentences"] == 50 and report["matmul_gflops_per_s"] > 0
    assert report["ratio"] == pytest.approx(report["levels"][-1]["sentences_per_s"]
                                            / report["translate_py"]["sentences_per_s"], rel=1e-2)
