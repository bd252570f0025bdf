"""serve.py's own parts: the model behind its API (service, batcher), a request's fields checked
(requests), and what makes it a drop-in for LibreTranslate (libretranslate)."""
