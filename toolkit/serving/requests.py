"""serve.py's front door: a request's fields read and checked before anything reaches the model's
queue, so that whatever a client sends wrong (a body in an unknown charset or invalid UTF-8, JSON
nested deep, a multipart body without its boundary, a lone surrogate, a number that is not one) is
a 4xx with its reason and never a 500; the ranges of serve.py's own flags, checked at start; and
aiohttp's log of a broken connection (a request line too long, a client gone mid-body) kept to one
line, since neither is the server's fault."""
import json
import logging
import re
import sys
import urllib.parse
import warnings

import aiohttp
import aiohttp.http_exceptions
import aiohttp.multipart
from aiohttp import web, web_protocol, web_server

from toolkit.serving.batcher import ApiError
from toolkit.base.errors import UserError
from toolkit.base.reading import is_finite_number, shown_number

#: serve.py's numeric flags: (flag, lowest, highest). A wait or timeout past a day would overflow
#: the clocks of the queue; the other highest values only keep the numbers finite.
SERVE_RANGES = (("port", 0, 65535), ("batch_wait_ms", 0, 60000), ("char_limit", 1, 10 ** 9),
                ("max_sentences", 1, 10 ** 6), ("queue_size", 1, 10 ** 6),
                ("timeout", 0.001, 86400), ("max_alternatives", 0, 64))
#: A whole number as a form sends it: ASCII digits only (str.isdigit takes "²", which int refuses).
DIGITS = re.compile(r"\s*[0-9]{1,9}\s*", re.ASCII)
#: A number as a form sends it: decimal ASCII, an exponent allowed.
DECIMAL = re.compile(r"\s*[-+]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})"
                     r"([eE][-+]?[0-9]{1,4})?\s*", re.ASCII)
#: Most fields in a form body.
MAX_FIELDS = 100


def check_flags(args):
    """Raises a UserError naming the first of serve.py's numeric flags that is not finite or is out
    of its range."""
    for flag, lowest, highest in SERVE_RANGES:
        value = getattr(args, flag)
        if not (is_finite_number(value) and lowest <= value <= highest):
            raise UserError("--%s %s is out of range: it must be from %s to %s"
                            % (flag, shown_number(value), lowest, highest))


async def read_fields(request):
    """The request's fields: a JSON object, a form (urlencoded or multipart) on top of the query
    string's; every value a string, a number, true/false/null or a list of those, every string
    valid Unicode. A 400 for anything else."""
    if request.content_type.startswith("multipart/"):
        fields = await multipart_fields(request)
    else:
        body = decoded(await body_bytes(request), request.charset)
        fields = json_fields(body) if request.content_type == "application/json" \
            else form_fields(body)
    fields = {**request.query, **fields}
    for name, value in fields.items():
        check_value(name, value)
    return fields


async def body_bytes(request):
    """The request's body, its Content-Encoding (gzip, deflate, br) undone;
    a 400 when it cannot be."""
    try:
        return await request.read()
    except web.RequestPayloadError as error:
        raise ApiError(400, "Invalid request: the body cannot be read (%s): send it as its "
                            "Content-Encoding says, or without one" % first_line(error)) from None


def first_line(error):
    """The first line of an error's message (an exception or a string), without the "STATUS,
    message:" that aiohttp's start with."""
    text = re.sub(r"^\d{3}, message:", "", str(error)).strip()
    return shorten(text.split("\n")[0].strip().rstrip(":"))


def decoded(body, charset):
    """The body as text in its charset (UTF-8 when none is given)."""
    try:
        return body.decode(charset or "utf-8")
    except LookupError:
        raise ApiError(400, "Invalid request: charset %s is not supported: send UTF-8"
                       % shown(charset)) from None
    except ValueError as error:  # UnicodeDecodeError and the codecs' own
        raise ApiError(400, "Invalid request: the body is not valid %s (%s)"
                       % (charset or "UTF-8", error)) from None


def json_fields(body):
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError(400, "Invalid request: the body is not valid JSON (or is nested "
                            "too deep)") from None
    if not isinstance(fields, dict):
        raise ApiError(400, "Invalid request: the JSON body must be an object")
    return fields


def form_fields(body):
    """A urlencoded form's fields (the last of a repeated name), its escapes strictly UTF-8."""
    try:
        return dict(urllib.parse.parse_qsl(body, keep_blank_values=True, errors="strict",
                                           max_num_fields=MAX_FIELDS))
    except ValueError as error:  # UnicodeDecodeError too
        raise ApiError(400, "Invalid request: the form body cannot be read (%s)" % error) from None


async def multipart_fields(request):
    """A multipart form's fields; files come as aiohttp's FileField. A part in a transfer encoding
    aiohttp does not know is a RuntimeError of aiohttp's, one with too many headers an
    HttpProcessingError: both the client's doing, a 400 naming it. (A part's Content-Encoding is
    not applied: its bytes are read as sent.)"""
    try:
        return dict(await request.post())
    except web.HTTPException:
        raise
    except (ValueError, LookupError, AssertionError, KeyError, TypeError, RuntimeError,
            aiohttp.http_exceptions.HttpProcessingError, web.RequestPayloadError) as error:
        raise ApiError(400, "Invalid request: the multipart body cannot be read (%s): send it with "
                            "its boundary and known encodings, or send JSON"
                       % first_line(error)) from None


def check_value(name, value):
    """A 400 unless value is a scalar or a list of scalars, with every string valid Unicode: the
    API's fields are no deeper, and a lone surrogate cannot be encoded."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, (list, dict)):
            raise ApiError(400, "Invalid request: %s holds %s; the API's fields are strings, "
                                "numbers or lists of those" % (shown(name), "an object" if
                                                                isinstance(item, dict) else
                                                                "a list inside a list"))
        if isinstance(item, str) and not valid_text(item):
            raise ApiError(400, "Invalid request: %s is not valid Unicode text (a "
                                "lone surrogate?)" % shown(name))
    if not valid_text(str(name)):
        raise ApiError(400, "Invalid request: a field's name is not valid Unicode text")


def valid_text(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value, most=40):
    """value's repr for an error message, cut to `most` characters and ASCII."""
    text = ascii(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def whole_number(fields, name, default=0):
    """A field given as a JSON integer or form digits (default when absent); a 400 otherwise."""
    value = fields.get(name, default)
    if isinstance(value, str) and DIGITS.fullmatch(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ApiError(400, "Invalid request: %s must be a whole number, not %s"
                       % (name, shown(value)))
    return value


def real_number(fields, name, default):
    """A field given as a JSON number or a form's decimal number (default when
    absent); a 400 otherwise."""
    value = fields.get(name, default)
    if isinstance(value, str) and DECIMAL.fullmatch(value):
        value = float(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ApiError(400, "Invalid request: %s must be a number, not %s" % (name, shown(value)))
    return value


def in_range(name, value, ranges):
    """value of the field name, a 400 naming the field and its range when ranges (hparams.RANGES)
    refuse it (inf, nan and integers too large for a float among them)."""
    valid, must_be = ranges[name]
    if not (is_finite_number(value) and valid(value)):
        raise ApiError(400, "Invalid request: %s %s is out of range: it must be %s"
                       % (name, shown_number(value), must_be))
    return value


class OneLine(logging.Formatter):
    """A log record as one line: its message and its exception's type and first line,
    never the traceback."""

    def format(self, record):
        line = "serve.py: %s" % record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            detail = first_line(error)
            line += ": %s%s" % (type(error).__name__, ": " + detail if detail else "")
        return line


def shorten(text, most=120):
    return escaped(text if len(text) <= most else text[:most - 3] + "...")


def escaped(text):
    """text for a log line or a header: every character that is not printable (line breaks, NUL,
    escape sequences, a line separator) as its Python escape, so that client text stays on one
    line and changes no terminal."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def connection_logger():
    """The logger aiohttp's protocol writes a malformed request or a lost connection to: one line
    each on standard error. aiohttp's warnings of a multipart header it cannot parse (two lines
    with the client's text) are silenced: the request's own line says how it was answered."""
    for category in (aiohttp.multipart.BadContentDispositionHeader,
                     aiohttp.multipart.BadContentDispositionParam):
        warnings.filterwarnings("ignore", category=category)
    logger = logging.getLogger("serve.connections")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(OneLine())
        logger.addHandler(handler)
        logger.propagate = False
    return logger


class ApiConnection(web_protocol.RequestHandler):
    """aiohttp's handler of a connection, answering a request it cannot parse (its request line,
    a header, a chunk, its length) with the API's JSON error instead of aiohttp's plain text."""

    def handle_error(self, request, status=500, exc=None, message=None):
        super().handle_error(request, status, exc, message)  # logs it (OneLine)
        if status >= 500:
            text = "internal error" if status == 500 else "the request timed out"
        else:
            text = "Invalid request: %s" % first_line(message or exc or status)
        response = web.json_response({"error": text}, status=status)
        response.force_close()
        return response


class ApiServer(web_server.Server):
    """aiohttp's server, making an ApiConnection of each connection."""

    def __call__(self):
        return ApiConnection(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """web.AppRunner whose connections are ApiConnections: the server aiohttp builds for the
    application (its router, middlewares and limits), made an ApiServer."""

    async def _make_server(self):
        server = await super()._make_server()
        server.__class__ = ApiServer
        return server


async def expect_handler(request):
    """The answer to an HTTP/1.1 request's Expect header: "100 Continue" to 100-continue, and a 417
    with the API's JSON error to any other expectation."""
    if request.version != aiohttp.HttpVersion11:
        return
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(
            text=json.dumps({"error": "Invalid request: Expect %s is not supported (only "
                                      "100-continue)" % shown(expect)}),
            content_type="application/json")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer itself is still to come
