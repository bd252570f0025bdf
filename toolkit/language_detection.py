"""Which language a text is in, for serve.py's /detect and source "auto": langdetect, the detector
LibreTranslate itself uses (so that a drop-in answers as it does), seeded so that the same text
always gets the same answer."""
from langdetect import DetectorFactory, detect_langs
from langdetect.lang_detect_exception import LangDetectException

#: Names of the language codes the server shows (ISO 639-1); another code is shown as itself.
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
                  "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
                  "zh": "Chinese"}

# langdetect draws random samples of the text's n-grams: a fixed seed makes it deterministic
DetectorFactory.seed = 0


def candidates(text):
    """[{"confidence": percent, "language": code}], most likely first; [] when the text has no
    letters to go by (digits, punctuation, nothing)."""
    try:
        found = detect_langs(text)
    except LangDetectException:
        return []
    return [{"confidence": round(100 * language.prob, 1), "language": language.lang}
            for language in found]


def language_name(code):
    return LANGUAGE_NAMES.get(code, code)


def warm_up():
    """Loads langdetect's language profiles now rather than in the first request."""
    candidates("warm up")
