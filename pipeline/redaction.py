"""Credentials never reach a log, an error message or MLflow: a URI's user:password@ part and the values of
environment variables that look like credentials are replaced by ***."""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import urlsplit, urlunsplit

SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)


def redact_uri(uri: str) -> str:
    """A URI with any user:password@ part replaced, safe for logs."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))
    return uri


def secret_values() -> list[str]:
    """Values of environment variables that look like credentials (never logged)."""
    values = [v for k, v in os.environ.items() if SECRET_ENV.search(k) and len(v) >= 6]
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    parts = urlsplit(uri) if uri else None
    if parts and parts.password:
        values.append(parts.password)
    return values


def redact(text: str) -> str:
    """Text with every credential value from the environment replaced by ***."""
    for secret in secret_values():
        text = text.replace(secret, "***")
    return text


class RedactingFilter(logging.Filter):
    """Masks credential values in every log record of the pipeline (tracebacks included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:  # --debug tracebacks: format once, redacted
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
