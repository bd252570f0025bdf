"""What makes serve.py a drop-in for LibreTranslate beyond /translate: CORS for browser pages on
other origins, /frontend/settings, and the translated files of /translate_file
kept for their download."""
import collections
import os
import urllib.parse
import uuid

from toolkit.serving.batcher import ApiError
from toolkit.serving.requests import shown
from toolkit.serving.service import language_name

#: The file types /translate_file translates, and the format each is translated as.
FILE_FORMATS = {".txt": "text", ".html": "html"}
#: Translated files kept for /download_file (the oldest is dropped past this).
KEPT_FILES = 64


def cors_origins(flag):
    """--cors_origins as a set of origins ("*": any)."""
    return {origin.strip() for origin in flag.split(",") if origin.strip()}


def cors_headers(request, origins):
    """The CORS headers of an answer to request (none when its Origin is not allowed); for a
    preflight (OPTIONS), the methods and headers the browser may use too."""
    origin = request.headers.get("Origin")
    if origin is None or not ("*" in origins or origin in origins):
        return {}
    headers = {"Access-Control-Allow-Origin": "*" if "*" in origins else origin}
    if "*" not in origins:
        headers["Vary"] = "Origin"
    if request.method == "OPTIONS":
        headers.update({"Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                        "Access-Control-Allow-Headers": request.headers.get(
                            "Access-Control-Request-Headers", "Content-Type"),
                        "Access-Control-Max-Age": "600"})
    return headers


def frontend_settings(service):
    """/frontend/settings: LibreTranslate's fields, as this server has them."""
    def language(code):
        return {"code": code, "name": language_name(code)}
    return {"charLimit": service.args.char_limit, "frontendTimeout": 500,
            "apiKeys": bool(service.args.api_key), "keyRequired": bool(service.args.api_key),
            "suggestions": service.suggestions is not None, "filesTranslation": True,
            "supportedFilesFormat": sorted(FILE_FORMATS),
            "language": {"source": language(service.source_lang),
                         "target": language(service.target_lang)}}


def uploaded_document(fields):
    """(text, format, file name) of /translate_file's file field; a 400 for a missing file, a type
    other than FILE_FORMATS' or text that is not UTF-8."""
    upload = fields.get("file")
    if upload is None or isinstance(upload, str) or not getattr(upload, "filename", ""):
        raise ApiError(400, "Invalid request: missing file parameter (a multipart file)")
    name = safe_file_name(upload.filename)
    extension = os.path.splitext(name)[1].lower()
    if extension not in FILE_FORMATS:
        raise ApiError(400, "Invalid request: file format %s not supported: send one of %s"
                       % (extension or "(none)", ", ".join(sorted(FILE_FORMATS))))
    try:
        text = upload.file.read().decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid request: the file is not UTF-8 text") from None
    if not text.strip():
        raise ApiError(400, "Invalid request: the file %s is empty: nothing to translate"
                       % shown(name))
    return text, FILE_FORMATS[extension], name


def safe_file_name(name):
    """The name an upload's translation is downloaded as: the file name the client sent without
    its folders, every character that is not printable (line breaks, NUL, a line separator) an
    underscore, so that it fits in a URL, a header and a log line."""
    name = os.path.basename(name.replace("\\", "/"))
    return "".join(char if char.isprintable() else "_" for char in name)


def content_disposition(name):
    """The Content-Disposition header of a download as name (RFC 6266): the name in ASCII with
    quotes and backslashes dropped, and whole in filename*, UTF-8 percent-encoded."""
    fallback = "".join(char for char in name if char.isascii() and char.isprintable()
                       and char not in '"\\')
    return "attachment; filename=\"%s\"; filename*=UTF-8''%s" % (
        fallback, urllib.parse.quote(name, safe=""))


class TranslatedFiles:
    """The last KEPT_FILES translated files, in memory, under names no client can guess."""

    def __init__(self):
        self.files = collections.OrderedDict()

    def add(self, data, name):
        """Keeps data (bytes) to be downloaded as name (safe_file_name's); returns the key of its
        download path."""
        key = "%s.%s" % (uuid.uuid4().hex, name)
        self.files[key] = data
        while len(self.files) > KEPT_FILES:
            self.files.popitem(last=False)
        return key

    def get(self, key):
        """(data, name) of key; a 404 when it is unknown or gone."""
        if key not in self.files:
            raise ApiError(404, "Not found: the translated file is gone or never was; translate it "
                                "again")
        return self.files[key], key.split(".", 1)[1]
