"""The Hugging Face Hub, where timm's and open_clip's pretrained weights come from.

Weights already in the Hub's local cache are loaded from there without asking the Hub: asked, huggingface_hub
retries an unreachable host five times with back-off (about 50 s, a warning a line) before it falls back to the
cache, and before it fails where they are not cached. Where they are not cached and the Hub cannot be reached,
the command fails at once with the fix.
"""
from __future__ import annotations

import socket
import urllib.request
from typing import Iterable
from urllib.parse import urlparse

from fedcache.errors import WeightsNotFoundError

_CONNECT_TIMEOUT_S = 5.0


def cached(repo_id: str, filenames: Iterable[str]) -> str | None:
    """The local path of the first of ``filenames`` of ``repo_id`` in the Hub's cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        path = try_to_load_from_cache(repo_id, filename)
        if isinstance(path, str):  # it also answers a sentinel for "known not to exist"
            return path
    return None


def refuse_if_unreachable(what: str, fix: str) -> None:
    """Raise WeightsNotFoundError when the Hub's host cannot be connected to. Through a proxy the host is not
    ours to reach directly, so nothing is checked there."""
    from huggingface_hub import constants

    proxies = urllib.request.getproxies()
    if any(proxies.get(k) for k in ("https", "http", "all")) or constants.HF_HUB_OFFLINE:
        return  # HF_HUB_OFFLINE fails at once by itself, and with the Hub's own message
    url = urlparse(constants.ENDPOINT)
    host = url.hostname or constants.ENDPOINT
    try:
        socket.create_connection((host, url.port or (80 if url.scheme == "http" else 443)),
                                 timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise WeightsNotFoundError(f"{what} are not in the Hugging Face cache and {host} cannot be reached "
                                   f"({reason}). {fix}") from exc


def hub_page(repo_id: str) -> str:
    """Where a person downloads ``repo_id``'s files by hand."""
    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo_id}"


def without_full_stop(exc: BaseException) -> str:
    """An exception's message to go inside a sentence of ours (the Hub's end with a full stop of their own)."""
    return str(exc).rstrip(". ")
