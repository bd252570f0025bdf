"""Load benchmark of serve.py on both engines: 1, 8 and 32 concurrent clients send one sentence per request for
--seconds each, to serve.py on the checkpoint (tensorflow) and on its CTranslate2 export (--ct2_model, or the checkpoint
exported now in int8); then translate.py's decoding translates the same sentences in batches, for comparison.

    python scripts/bench_serve.py --logdir runs/multi30k [--input FILE] [--seconds 10] [--clients 1,8,32]
        [--serve_flags "--batch_wait_ms 5"] [decoding flags of translate.py, e.g. --beam_size 4, for both]

It starts serve.py itself (on a free 127.0.0.1 port) and stops it before translate.py's run, so that the two never
share the CPU. Per level it prints requests/s, sentences/s, p50/p95 latency, failed requests (anything but an
answer or a 429) and 429s; then the server's resident memory (RSS) after start-up and after the last level, and
translate.py's sentences/s over the input (model loading excluded: translate.translate_all alone is timed). The
last line is one JSON object with all of it: "engines" (per engine its "levels" and "server_rss_mb"; the first
engine's also at the top level) and "ratio": the first engine's sentences/s at the most clients over
translate.py's. Clients are threads on keep-alive connections, in this process: on a small machine they take CPU
from the server too. Per engine, "languages_under_long_requests": the slowest GET /languages while one request of
5,000 characters of punctuation and one at the server's --char_limit are worked on (languages_slowest_ms), the
slowest alone (languages_usual_ms), and those two requests' status and ms.
"""
import argparse
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from toolkit.base import runtime  # noqa: E402 (first of the project's modules: TensorFlow's environment defaults)
from toolkit.base import machine
from toolkit.base.cli import OneLineParser, run_cli  # noqa: E402
from toolkit.base.errors import UserError
from toolkit.base.reading import read_lines  # noqa: E402

#: Multi30k's test sources, in the shared data beside the repository.
DEFAULT_INPUT = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test.de")
#: The line serve.py writes once it answers, with the address it listens on.
SERVING = re.compile(r"serving .* on http://([^:]+):(\d+)")
#: Sentences translate.py's decoding runs once, untimed, before it is timed (as the server's first level warms it).
WARM_UP = 16


class Server:
    """serve.py in a subprocess on a free port of 127.0.0.1, its standard error in a file; started when entered,
    stopped with SIGTERM when left. url: its address, once it answers."""

    def __init__(self, flags, start_timeout=600):
        self.flags, self.start_timeout = list(flags), start_timeout

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="serve-", suffix=".log")
        self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "serve.py"), "--port", "0", *self.flags],
                                        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + self.start_timeout
        while not SERVING.search(self.stderr()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                lines = self.stderr().strip().splitlines() or ["no output"]
                raise UserError("serve.py did not start: %s" % lines[-1].removeprefix("error: "))
            time.sleep(0.2)
        host, port = SERVING.search(self.stderr()).groups()
        self.host, self.port, self.url = host, int(port), "http://%s:%s/" % (host, port)
        return self

    def __exit__(self, *exc):
        self.stop()
        self.log.close()

    def stderr(self):
        with open(self.log.name, encoding="utf-8") as log:
            return log.read()

    def stop(self):
        """SIGTERM, then the exit code (None if it had to be killed after a minute)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def rss_mb(self):
        """The server's resident memory, MB."""
        with open("/proc/%d/status" % self.process.pid) as status:
            kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kb / 1024


def client(server, pair, sentences, offset, step, deadline, out):
    """Sends sentences[offset::step] (cycled) one per request until deadline; appends (status, ms) to out
    (status 0 for a connection error)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
    k = offset
    while time.monotonic() < deadline:
        body = json.dumps({"q": sentences[k % len(sentences)], "source": pair[0], "target": pair[1]})
        k += step
        start = time.monotonic()
        try:
            connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            connection.close()
            status = 0
        out.append((status, 1000 * (time.monotonic() - start)))
    connection.close()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else None


def load_level(server, pair, sentences, clients, seconds):
    """One level of load: `clients` threads for `seconds`. Returns its figures."""
    results, start = [], time.monotonic()
    threads = [threading.Thread(target=client, args=(server, pair, sentences, k, clients, start + seconds, results))
               for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    answered = [ms for status, ms in results if status == 200]
    return {"clients": clients, "requests": len(results), "requests_per_s": round(len(results) / elapsed, 2),
            "sentences_per_s": round(len(answered) / elapsed, 2),
            "p50_ms": round(percentile(answered, 0.5), 1) if answered else None,
            "p95_ms": round(percentile(answered, 0.95), 1) if answered else None,
            "failed": sum(status not in (200, 429) for status, _ in results),
            "rejected_429": sum(status == 429 for status, _ in results)}


def timed_request(server, method, path, body=None):
    """(status, ms) of one request on a new connection (status 0 for a connection error)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=600)
    start = time.monotonic()
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        response = connection.getresponse()
        response.read()
        status = response.status
    except (OSError, http.client.HTTPException):
        status = 0
    finally:
        connection.close()
    return status, 1000 * (time.monotonic() - start)


def languages_under_long_requests(server, pair, sentences):
    """How /languages answers while long requests run: its slowest answer (ms) alone (10 tries) and
    while one request of 5,000 characters of punctuation and one at the server's --char_limit (the
    input's sentences repeated) are worked on, polled on new connections until both are answered;
    with those requests' status and ms."""
    usual = max(timed_request(server, "GET", "/languages")[1] for _ in range(10))
    limit = json.loads(urllib.request.urlopen(server.url + "frontend/settings", timeout=60).read())["charLimit"]
    text = " ".join(sentences)
    texts = {"punctuation_5k": ".," * 2500, "at_char_limit": (text * (limit // len(text) + 1))[:limit]}
    answers = {}

    def ask(name):
        status, ms = timed_request(server, "POST", "/translate",
                                   json.dumps({"q": texts[name], "source": pair[0], "target": pair[1]}))
        answers[name] = {"chars": len(texts[name]), "status": status, "ms": round(ms, 1)}

    threads = [threading.Thread(target=ask, args=(name,)) for name in texts]
    for thread in threads:
        thread.start()
    waits = []
    while len(answers) < len(texts):
        waits.append(timed_request(server, "GET", "/languages")[1])
    for thread in threads:
        thread.join()
    return {"languages_usual_ms": round(usual, 1), "languages_slowest_ms": round(max(waits), 1),
            "languages_answers": len(waits), "long_requests": answers}


def translate_py_speed(decoding_flags, sentences):
    """translate.py's sentences/s over sentences: its translate_all, timed without loading the model."""
    import translate
    from toolkit.translating.trained_model import TrainedModel
    from toolkit.translating.translator import Translator
    runtime.start_graph_mode()
    hp, args = translate.parse_args(decoding_flags)
    trained = TrainedModel(hp, hp.ckpt)
    sp, translator = trained.sentencepiece(), Translator(trained)
    for lines in (sentences[:WARM_UP], sentences[:2 * WARM_UP]):  # the first runs of new shapes are slow
        translate.translate_all(translator, lines, sp, hp.maxlen1 - 1, None, args, None, io.StringIO(), "line")
    start = time.monotonic()
    translate.translate_all(translator, sentences, sp, hp.maxlen1 - 1, None, args, None, io.StringIO(),
                            "line")
    elapsed = time.monotonic() - start
    translator.close()
    return {"sentences": len(sentences), "sentences_per_s": round(len(sentences) / elapsed, 2)}


def matmul_reading(decoding_flags):
    """A 2048x2048 fp32 matmul's GFLOP/s with the sessions' threads, read in this sitting."""
    import translate
    from bench_train import matmul_gflops
    runtime.start_graph_mode()
    hp, _ = translate.parse_args(decoding_flags)
    return round(matmul_gflops(machine.session_config(hp)), 1)


def build_parser():
    parser = OneLineParser(prog="bench_serve.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--logdir", required=True, help="a logdir written by train.py")
    parser.add_argument("--input", default=DEFAULT_INPUT, help="UTF-8 sentences, one per line (empty lines skipped)")
    parser.add_argument("--seconds", type=float, default=10, help="how long each level of load lasts")
    parser.add_argument("--clients", default="1,8,32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--engines", default="tensorflow,ctranslate2",
                        help="serve.py's engines to load, comma-separated, in order; the ratio is the first's")
    parser.add_argument("--ct2_model", default="",
                        help="the export (export.py --format ctranslate2) the ctranslate2 engine serves; default: the "
                        "checkpoint exported now with --ct2_quantization")
    parser.add_argument("--ct2_quantization", default="int8", help="export.py's --quantization of that export")
    parser.add_argument("--serve_flags", default="", help="more flags for serve.py alone, e.g. '--batch_wait_ms 5'")
    return parser


def main(argv=None):
    args, decoding = build_parser().parse_known_args(argv)
    try:
        sentences = [line for line in read_lines(args.input) if line.strip()]
    except OSError as error:
        raise UserError("cannot read --input %s: %s" % (args.input, error.strerror)) from None
    if not sentences:
        raise UserError("--input %s has no sentences" % args.input)
    flags = ["--logdir", args.logdir, *decoding]
    levels = [int(clients) for clients in args.clients.split(",")]
    engines = {}
    for engine in args.engines.split(","):
        engine_flags = ctranslate2_flags(args, decoding) if engine == "ctranslate2" else []
        engines[engine] = serve_levels(engine, flags + engine_flags + args.serve_flags.split(),
                                       sentences, levels, args.seconds)
    reference = translate_py_speed(flags + ["--input", args.input], sentences)
    print("translate.py: %(sentences_per_s).1f sentences/s over %(sentences)d sentences" % reference, flush=True)
    first = next(iter(engines.values()))
    ratio = first["levels"][-1]["sentences_per_s"] / reference["sentences_per_s"]
    print(json.dumps({"machine": machine.machine_summary(), "matmul_gflops_per_s": matmul_reading(flags + ["eins"]),
                      "seconds": args.seconds, **first, "engines": engines, "translate_py": reference,
                      "ratio": round(ratio, 3)}))
    return 0


def serve_levels(engine, flags, sentences, levels, seconds):
    """Every level of load on serve.py started with flags: {"levels": figures, "server_rss_mb": ...}."""
    with Server(flags) as server:
        pair = language_pair(server)
        rss_start = server.rss_mb()
        figures = []
        for clients in levels:
            figures.append(load_level(server, pair, sentences, clients, seconds))
            print("%s, %%(clients)d clients: %%(requests_per_s).1f requests/s, %%(sentences_per_s).1f sentences/s, "
                  "p50 %%(p50_ms)s ms, p95 %%(p95_ms)s ms, %%(failed)d failed, %%(rejected_429)d 429s" % engine
                  % figures[-1], flush=True)
        rss_end = server.rss_mb()
        under_long = languages_under_long_requests(server, pair, sentences)
        print("%s: /languages answered in %%(languages_slowest_ms).1f ms at most (%%(languages_answers)d answers) "
              "while the long requests ran; %%(languages_usual_ms).1f ms at most alone" % engine % under_long,
              flush=True)
    return {"levels": figures, "server_rss_mb": {"start": round(rss_start, 1), "end": round(rss_end, 1)},
            "languages_under_long_requests": under_long}


def ctranslate2_flags(args, decoding):
    """serve.py's flags of the CTranslate2 engine: --ct2_model, or the checkpoint exported now (with
    --ct2_quantization) into a directory removed at exit."""
    model = args.ct2_model
    if not model:
        import export
        directory = tempfile.TemporaryDirectory(prefix="bench-ct2-")
        EXPORTS.append(directory)
        model = os.path.join(directory.name, "model")
        if export.main(["--logdir", args.logdir, *decoding, "--export_dir", model, "--format", "ctranslate2",
                        "--quantization", args.ct2_quantization]) != 0:
            raise UserError("export.py --format ctranslate2 failed")
    return ["--engine", "ctranslate2", "--model", model]


#: The temporary directories of models exported by ctranslate2_flags, removed when the process ends.
EXPORTS = []


def language_pair(server):
    """The model's (source, target) languages, as the server's /languages says: sent as they are, since "auto" would
    time the language detector too and refuse a sentence it takes for another language."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    connection.request("GET", "/languages")
    languages = json.loads(connection.getresponse().read())
    connection.close()
    return next((language["code"], language["targets"][0]) for language in languages if language["targets"])


if __name__ == "__main__":
    run_cli(main)
