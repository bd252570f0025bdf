"""An HTTP translation server for a model trained by this toolkit: LibreTranslate's API, and a page
to try it at /.

    python serve.py --logdir runs/multi30k --port 5000 [--host 127.0.0.1] \\
        [--beam_size 4 --ckpt PATH ...]
    python serve.py --engine ctranslate2 --model ct2/multi30k   # export.py --format ctranslate2
    curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
         -d '{"q": "Ein Mann schläft.", "source": "de", "target": "en"}'

Endpoints (docs/serving.md has every field and error):
    POST /translate  q (a string or a list of strings), source (the model's source language or
                     "auto"), target, format ("text" or "html"), alternatives (how many n-best
                     entries besides the best), api_key; beyond LibreTranslate: attention true
                     (q one string) adds "nbest" [{text, score}] and "attention"
                     [{source, target, weights}], the best translation's cross-attention of the
                     last decoder block averaged over heads, (target pieces, source pieces), one
                     per model input; the decoding options min_len_a, min_len_b,
                     sampling_topk, sampling_topp, sampling_temperature, no_repeat_ngram_size,
                     repetition_penalty and min_confidence (the flags' names and ranges; the
                     flags give the defaults), and prefix (a string, or one per q item) that
                     the translation starts with. Answers translatedText and its confidence
                     (the geometric mean of its tokens' probabilities); below min_confidence
                     translatedText is "".
    POST /detect     the languages langdetect finds in q, most likely first
    POST /translate_file  a .txt or .html file (multipart: file, source, target, api_key): answers
                     translatedFileUrl, its translation at GET /download_file/KEY
    POST /suggest    LibreTranslate's: q, s (a better translation), source, target, api_key;
                     with --suggestions DB, stored with the model and its translation of q (the
                     translation field, what the page showed, or q translated now); {"success":
                     true} once committed, a 403 without --suggestions
    POST /admin/reload  logdir, api_key (needs --api_key): loads the logdir's newest checkpoint
                     in the background and serves it from the next batch on; SIGHUP does the same
                     with the logdir of --reload_file (or the served one's newest checkpoint)
    GET  /frontend/settings  LibreTranslate's settings (charLimit, keyRequired, suggestions, ...)
    GET  /languages  the model's two languages
    GET  /           the page: a text box, the translation, its n-best with scores and its
                     attention heat map
CORS headers answer the origins of --cors_origins (any by default), a preflight too.
With --memory DB, a q item of /translate found in the translation memory (its normalised text, for
the request's languages) is answered from it, and "memory" says which items were (true/false per
item, shaped as translatedText); `python -m toolkit.serving.suggestions` imports pairs and accepts
suggestions into it, read afresh on every request.
Fields come as JSON or as a form. Errors answer {"error": "..."}: 400 bad request, 403 wrong
api_key (or /suggest without --suggestions), 429 queue full, 503 the database busy past its wait,
504 past --timeout, 500 a failure of the server itself.

Text is translated line by line, each line sentence by sentence (spaCy's sentencizer; the spacing
kept), each as translate.py translates a line; --no_split translates a line whole, as translate.py
does. With format html the text between tags is, each run separately, and the tags stay.
Requests share one queue: a worker thread takes the sentences that arrive within --batch_wait_ms,
up to --test_batch_size, and runs the model on them at once, sorted by length. SIGTERM or Ctrl-C
stops accepting connections, answers the requests already in, and exits 0. One line per request
goes to standard error.
"""
import os
import signal

# a SIGHUP before serve() takes it (a reload asked while the server loads) must not end it
if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

from toolkit.base import runtime  # noqa: E402 (first of the project's: TensorFlow's defaults)

import asyncio
import sys
import time
import traceback

from aiohttp import web

from hparams import DECODING_FLAGS, Hparams, parse_flags
from toolkit.serving.batcher import ApiError
from toolkit.base.errors import UserError, error_line
from toolkit.base.cli import run_cli
from toolkit.serving.requests import (ApiRunner, check_flags, connection_logger, escaped,
                                      expect_handler, read_fields, shown)
from toolkit.translating.trained_model import decoding_flags, trained_hparams
from toolkit.translating.ctranslate2_engine import exported_hparams
from toolkit.serving.libretranslate import (TranslatedFiles, content_disposition, cors_headers,
                                            cors_origins, frontend_settings, uploaded_document)
from toolkit.serving.service import candidates, language_name
from toolkit.serving.service import Service, nonnegative_int, translation_body


#: The page served at /.
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_page", "index.html")


# ---------------------------------------------------------------- flags
def build_parser():
    """hparams.py's parser with its decoding flags, and the flags of serve.py alone."""
    parser = Hparams(DECODING_FLAGS, "serve.py",
                     "Serve a trained model over HTTP with LibreTranslate's API and a page to try "
                     "it at / (see the top of serve.py and docs/serving.md). Its language codes "
                     "are those prepro.py recorded in the data dir's manifest.json (--src_lang, "
                     "--tgt_lang).").parser
    group = parser.add_argument_group("serve.py")
    group.add_argument("--host", default="127.0.0.1",
                       help="address to listen on; 0.0.0.0 listens on every interface")
    group.add_argument("--port", type=int, default=5000,
                       help="TCP port to listen on (LibreTranslate's); 0 picks a free one, named "
                            "in the 'serving on' line")
    group.add_argument("--batch_wait_ms", type=float, default=5,
                       help="how long the worker waits for more sentences to batch with the first "
                            "waiting one; 0 runs each request's sentences as soon as the "
                            "model is free")
    group.add_argument("--char_limit", type=int, default=5000,
                       help="most characters of one q item (each item of a list counts alone, as "
                            "in LibreTranslate); more is a 400")
    group.add_argument("--max_sentences", type=int, default=200,
                       help="most sentences in one request (lines of q, text runs of html, and the "
                            "parts a line longer than the model's --maxlen1 is split into); more "
                            "is a 400")
    group.add_argument("--queue_size", type=int, default=64,
                       help="most requests waiting or being translated at once; one more is "
                            "refused with 429")
    group.add_argument("--timeout", type=float, default=60,
                       help="seconds a request may wait for its translations; then it gets a 504 "
                            "(and is dropped if the model has not started on it)")
    group.add_argument("--engine", choices=["tensorflow", "ctranslate2"], default="tensorflow",
                       help="tensorflow (default): the checkpoint in --logdir; ctranslate2: the "
                            "directory --model written by export.py --format ctranslate2 (int8 "
                            "too), its decoding settings under the decoding flags "
                            "given; no attention")
    group.add_argument("--model", default="", metavar="DIR",
                       help="with --engine ctranslate2: the exported model directory")
    group.add_argument("--no_split", action="store_true",
                       help="translate each line (html text run) whole, as before, instead of each "
                            "of its sentences alone (spaCy's rule-based sentencizer)")
    group.add_argument("--max_alternatives", type=int, default=3, help=(
        "most alternatives a request may ask for; past --beam_size - 1 the request is decoded "
        "under a beam of alternatives + 1"))
    group.add_argument("--cors_origins", default="*", help=(
        "origins whose browser pages may call the API (CORS), comma-separated; * (default) allows "
        "any, an empty value none (pages of the server's own origin only)"))
    group.add_argument("--api_key", default="",
                       help="if given, /translate, /detect and /suggest need this api_key field "
                            "(403 without it), and POST /admin/reload is allowed with it; the "
                            "page sends the one in its address, /?api_key=KEY")
    group.add_argument("--suggestions", default="", metavar="DB", help=(
        "a SQLite file (created if new) that keeps what users suggest through POST /suggest "
        "(LibreTranslate's), with the model and its translation; without it /suggest is a 403"))
    group.add_argument("--memory", default="", metavar="DB", help=(
        "a SQLite file (may be --suggestions' own) whose translation memory answers a q item "
        "that matches a pair exactly (spacing aside) instead of the model; fed by `python -m "
        "toolkit.serving.suggestions import|accept`, read afresh on every request"))
    group.add_argument("--reload_file", default="", metavar="FILE", help=(
        "on SIGHUP, serve the logdir named on this file's first line (loaded in the "
        "background, swapped in between batches); without it, or while the file is absent, "
        "SIGHUP reloads the served logdir's newest checkpoint"))
    return parser


def parse_args(argv):
    """Returns hp (LOGDIR/hparams.json with the decoding flags given on top) and every flag."""
    args, given = parse_flags(build_parser(), argv)
    check_flags(args)
    if args.engine == "ctranslate2":
        return exported_hparams(args.model, given, args.test_batch_size, args.threads), args
    return trained_hparams(args.logdir, decoding_flags(given)), args


# ---------------------------------------------------------------- the API
async def translate_handler(request):
    service, fields = request.app["service"], await read_fields(request)
    service.check_key(fields)
    items = service.items(fields)
    service.check_languages(fields)
    fmt = fields.get("format", "text")
    if fmt not in ("text", "html"):
        raise ApiError(400, "Invalid request: format %s is not supported: pass text or html"
                       % shown(fmt))
    alternatives = nonnegative_int(fields, "alternatives", service.most_alternatives,
                                   "--max_alternatives, or --beam_size - 1")
    attention = service.wants_attention(fields)
    settings, n = service.decoding_of(fields, alternatives)
    min_confidence, prefixes = service.min_confidence(fields), service.prefixes(fields, items)
    detections = await service.off_loop(service.detect_source, items) \
        if fields.get("source") == "auto" else None
    entries, maps, request["sentences"], memory = await service.answer_items(
        items, fmt, attention, settings, n, prefixes)
    return web.json_response(translation_body(fields, entries, alternatives,
                                              maps if attention else None, detections,
                                              min_confidence, memory))


async def translate_file_handler(request):
    service, fields = request.app["service"], await read_fields(request)
    service.check_key(fields)
    text, fmt, name = uploaded_document(fields)
    service.items({"q": text})
    service.check_languages(fields)
    if fields.get("source") == "auto":
        await service.off_loop(service.detect_source, [text])
    entries, _, request["sentences"] = await service.translate_texts([text], fmt)
    key = request.app["files"].add(entries[0][0][0].encode("utf-8"), name)
    return web.json_response({"translatedFileUrl": str(request.url.join(
        request.app.router["download"].url_for(key=key)))})


async def suggest_handler(request):
    service, fields = request.app["service"], await read_fields(request)
    service.check_key(fields)
    if service.suggestions is None:
        raise ApiError(403, "Suggestions are disabled on this server.")  # LibreTranslate's words
    q, s, _, _ = service.suggestion(fields)
    await service.suggest(q, s, fields)  # committed before the answer
    return web.json_response({"success": True})


async def reload_handler(request):
    service, fields = request.app["service"], await read_fields(request)
    service.check_admin_key(fields)
    logdir = fields.get("logdir")
    if not logdir or not isinstance(logdir, str):
        raise ApiError(400, "Invalid request: missing logdir parameter (the logdir of the model "
                            "to serve)")
    old = service.batcher.model.name
    try:
        name = await service.reload(logdir)
    except Exception as error:  # noqa: BLE001 (a logdir the user can fix is a 400, a bug a 500)
        line = error_line(error)
        if line is None:
            raise
        raise ApiError(400, "Invalid request: cannot serve %s: %s; still serving %s"
                       % (shown(logdir, 200), line, old)) from None
    print("serve.py: now serving %s (POST /admin/reload)" % escaped(name), file=sys.stderr,
          flush=True)
    return web.json_response({"success": True, "model": name})


async def download_handler(request):
    data, name = request.app["files"].get(request.match_info["key"])
    return web.Response(body=data, headers={"Content-Disposition": content_disposition(name)})


async def detect_handler(request):
    service, fields = request.app["service"], await read_fields(request)
    service.check_key(fields)
    items = service.items(fields)
    return web.json_response(await service.off_loop(candidates, "\n".join(items)))


async def settings_handler(request):
    return web.json_response(frontend_settings(request.app["service"]))


async def languages_handler(request):
    service = request.app["service"]
    languages = ((service.source_lang, [service.target_lang]), (service.target_lang, []))
    return web.json_response([
        {"code": code, "name": language_name(code), "targets": targets}
        for code, targets in languages])


async def page_handler(request):
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache"})


@web.middleware
async def log_and_errors(request, handler):
    """Answers errors as {"error": ...} and writes one line per request to standard error: method,
    path, status, sentences translated, milliseconds."""
    start, request["sentences"] = time.monotonic(), 0
    cors = cors_headers(request, request.app["cors_origins"])
    if request.method == "OPTIONS":  # a browser's CORS preflight
        return web.Response(status=204, headers=cors)
    try:
        response = await handler(request)
    except ApiError as error:
        response = web.json_response({"error": str(error)}, status=error.status)
    except web.HTTPException as error:  # aiohttp's own: 404, 405, 413
        response = web.json_response({"error": error.text or error.reason}, status=error.status)
    except ConnectionError:  # the client left before its request was read: nobody to answer
        print("%s %s client disconnected" % (request.method, escaped(request.path)),
              file=sys.stderr, flush=True)
        return web.Response(status=400)
    # a bug or a failed model run: a 500, the server goes on
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        response = web.json_response({"error": "internal error: %s" % error}, status=500)
    response.headers.update(cors)
    print("%s %s %d %d sentences %.0f ms"  # the path escaped: a client's %0A is no new line
          % (request.method, escaped(request.path), response.status, request["sentences"],
                                             1000 * (time.monotonic() - start)), file=sys.stderr,
          flush=True)
    return response


#: The API's routes: (method, path, handler, name).
ROUTES = (("POST", "/translate", translate_handler, None),
          ("POST", "/translate_file", translate_file_handler, None),
          ("GET", "/download_file/{key}", download_handler, "download"),
          ("GET", "/frontend/settings", settings_handler, None),
          ("POST", "/detect", detect_handler, None),
          ("POST", "/suggest", suggest_handler, None),
          ("POST", "/admin/reload", reload_handler, None),
          ("GET", "/languages", languages_handler, None),
          ("GET", "/", page_handler, None))


def build_app(service):
    # a body may hold --char_limit characters, each up to 6 bytes as a JSON escape,
    # and the other fields
    app = web.Application(middlewares=[log_and_errors], client_max_size=6 * service.args.char_limit
                          + 65536)
    app["service"], app["files"] = service, TranslatedFiles()
    app["cors_origins"] = cors_origins(service.args.cors_origins)
    for method, path, handler, name in ROUTES:
        add = app.router.add_get if method == "GET" else app.router.add_post  # GET answers HEAD
        add(path, handler, name=name, expect_handler=expect_handler)
    return app


async def serve(service, args):
    """Serves until SIGTERM or SIGINT, then stops accepting, answers the requests already
    in, and returns."""
    runner = ApiRunner(build_app(service), access_log=None, shutdown_timeout=args.timeout + 5,
                           logger=connection_logger())
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as error:
        await runner.cleanup()
        raise UserError("cannot listen on %s port %d (%s): pass another --port or --host"
                        % (args.host, args.port, error.strerror)) from None
    stop, loop = asyncio.Event(), asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reloads = set()  # the SIGHUP reloads running: kept referenced until done
    loop.add_signal_handler(signal.SIGHUP, lambda: start_reload(service, args, reloads))
    host, port = runner.addresses[0][:2]
    print("serve.py: serving %s -> %s on http://%s:%d"
          % (service.source_lang, service.target_lang, host, port), file=sys.stderr, flush=True)
    await stop.wait()
    print("serve.py: stopping: answering the requests already in", file=sys.stderr, flush=True)
    await runner.cleanup()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(signum)


def start_reload(service, args, reloads):
    """SIGHUP: reloads the model in the background (reload_on_signal)."""
    task = asyncio.ensure_future(reload_on_signal(service, args))
    reloads.add(task)
    task.add_done_callback(reloads.discard)


async def reload_on_signal(service, args):
    """Swaps in the logdir that --reload_file names (its first line), or without that file the
    newest checkpoint of the logdir served now; one line says what is served, or why not."""
    logdir = service.logdir
    try:
        if args.reload_file and os.path.exists(args.reload_file):
            logdir = reload_path(args.reload_file)
        name = await service.reload(logdir)
        line = "now serving %s (SIGHUP)" % name
    except Exception as error:  # noqa: BLE001 (a bad model: one line, and the old one stays)
        reason = error_line(error)
        if reason is None:  # a bug: its traceback too
            traceback.print_exc()
            reason = type(error).__name__
        line = "SIGHUP: cannot serve %s: %s; still serving %s" % (logdir, reason,
                                                                   service.batcher.model.name)
    print("serve.py: %s" % escaped(line), file=sys.stderr, flush=True)


def reload_path(path):
    """The logdir that a --reload_file names: its first line, stripped."""
    with open(path, encoding="utf-8") as lines:
        logdir = lines.readline().strip()
    if not logdir:
        raise UserError("--reload_file %s names no logdir: write the logdir's path on its first "
                        "line" % path)
    return logdir


def main(argv=None):
    runtime.start_graph_mode()
    hp, args = parse_args(argv)
    service = Service(hp, args)
    try:
        asyncio.run(serve(service, args))
    finally:
        service.close()
    print("serve.py: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
