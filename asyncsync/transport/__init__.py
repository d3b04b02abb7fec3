"""Transports: in-process (local.py), HTTP client and server (+ hosting), refusal codes.

Importing this package registers the ``http`` scheme, so a `Worker` can be given a URL.
"""

from asyncsync.transport import http_client as _http_client  # noqa: F401 (registers http)
