"""Validation errors as a person reads them: the form's own words for each
field and rule, never the API's pattern text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# What the console's forms call the request fields.
LABELS = {
    "name": "Name",
    "modelName": "Model",
    "locationName": "Location",
    "gpuType": "GPU type",
    "gpuCount": "GPU count",
    "minReplicas": "Min replicas",
    "maxReplicas": "Max replicas",
    "scaleToZeroRetentionPeriodSeconds": "Scale to zero after idle",
    "projectId": "Project",
}

# Fields with a pattern: what the pattern asks for, in words.
PATTERNS = {
    "name": "use lowercase letters, digits and '-' (up to 63), starting with a letter or digit",
    "projectId": "use lowercase letters, digits and '-' (up to 63), starting with a letter or "
    "digit",
}


def _field(error: Mapping[str, Any]) -> str:
    loc = error.get("loc") or ()
    return str(loc[0]) if loc else ""


def human_message(error: Mapping[str, Any]) -> str:
    field = _field(error)
    label = LABELS.get(field, field or "The form")
    error_type = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if error_type == "string_pattern_mismatch":
        return f"{label}: {PATTERNS.get(field, 'not in the expected form')}."
    if error_type in ("missing", "string_too_short") and field:
        return f"{label}: required."
    if error_type == "string_too_long":
        return f"{label}: at most {ctx.get('max_length')} characters."
    if error_type == "greater_than_equal":
        return f"{label}: at least {ctx.get('ge')}."
    if error_type == "less_than_equal":
        return f"{label}: at most {ctx.get('le')}."
    if error_type in ("int_type", "int_parsing"):
        return f"{label}: a whole number."
    message = str(error.get("msg", "invalid value"))
    return f"{label}: {message[:1].lower() + message[1:]}."


def human_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    return " ".join(human_message(e) for e in errors)
