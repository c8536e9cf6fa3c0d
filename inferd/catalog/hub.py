"""Can this machine reach the Hugging Face Hub? Asked before a download, so
that a machine without a network says so in seconds instead of after
huggingface_hub's retries (about 47 s here), with the command that fetches
the files elsewhere.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 3.0


def hub_endpoint(env: Mapping[str, str] | None = None) -> str:
    environ = os.environ if env is None else env
    return environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def hub_unreachable(
    env: Mapping[str, str] | None = None, timeout: float = CONNECT_TIMEOUT_S
) -> str | None:
    """None when a TCP connection to the Hub opens; else why not (a name that
    does not resolve, a refused or timed-out connection). A proxy the
    environment names is trusted to reach it."""
    environ = os.environ if env is None else env
    if any(environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlsplit(hub_endpoint(environ))
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc.strerror or type(exc).__name__})"


def download_hint(repo_id: str) -> str:
    """The command that fetches a repository where a network exists (`hf`,
    the Hub's current CLI; `huggingface-cli` is its deprecated name)."""
    return f"hf download {repo_id} --local-dir DIR"
