"""Redaction of secrets in text: error messages and log records.

A leaf module (no inferd imports), so that errors, logging setup and the
token code can all use it without depending on the control plane.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

# Anything shaped like one of our secrets, for log redaction. Deliberately
# looser than a valid token (any length ≥ 8, no checksum check) so that a
# truncated or mistyped token is redacted too.
TOKEN_PATTERN = re.compile(r"infd_(?:ep|admin|key)_[0-9A-Za-z]{8,}")
# Whatever follows "Bearer " is a secret even when it is not one of ours
# (an operator-chosen admin key); but not a placeholder such as "<your key>"
# in inferd's own hints, which no key starts with.
_BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)(?!<)[^\s\"',;]+")


def redact(text: str) -> str:
    text = TOKEN_PATTERN.sub(lambda m: "_".join(m.group(0).split("_", 2)[:2]) + "_***", text)
    return _BEARER_PATTERN.sub(r"\1***", text)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and traceback) with secrets replaced by ***.

    Attach it to *handlers*: a filter on a logger does not see records that
    propagate from child loggers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # Redact the format string and each argument separately rather than
        # collapsing them into one message: some formatters (uvicorn's access
        # log) read `record.args` as a tuple.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_value(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: _redact_value(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _redact_value(value: object) -> object:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes | bytearray):
        return redact(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, int | float | bool) or value is None:
        return value
    # Anything else is formatted with str()/repr() later: do it now, redacted.
    return redact(str(value))


def install_redaction(loggers: Mapping[str, logging.Logger] | None = None) -> None:
    """Add a `RedactingFilter` to every handler of the root and named loggers."""
    targets = [logging.getLogger()]
    targets += list((loggers or {}).values())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        targets.append(logging.getLogger(name))
    for logger in targets:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())


def redact_url(database_url: str) -> str:
    """The URL without its password, for logs and messages."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or "@" not in rest:
        return database_url
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}{':***' if ':' in userinfo else ''}@{host}"
