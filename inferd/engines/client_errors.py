"""The engines' exceptions that mean "the request is wrong", as inferd's 400.

vLLM raises its own classes for a request it refuses (`VLLMValidationError`
and the rest of `VLLMClientError`, none of them a `ValueError`); pydantic
raises `ValidationError` wherever an engine validates a body against its own
request model. Whatever path one of them escapes by, the replica answers
it as a 400 naming the parameter, as vLLM's own server does, and never as a
500: a malformed request is the client's to fix, not an alert for the
operator. Classes are recognised by name so that this module imports no
engine (the replica of a fake or diffusers engine has no vLLM to import).
"""

from __future__ import annotations

from typing import Any

from inferd.errors import BadRequest, InferdError, NotFound, field_path


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def client_error(exc: BaseException) -> InferdError | None:
    """The inferd error `exc` stands for when it is a refusal of the
    request's content; None for anything else (a failure of the server)."""
    if isinstance(exc, InferdError):
        return exc
    names = _class_names(exc)
    module = type(exc).__module__
    if module.startswith("vllm") and "VLLMClientError" in names:
        parameter = getattr(exc, "parameter", None)
        if "VLLMNotFoundError" in names:
            return NotFound(str(exc), param=parameter)
        return BadRequest(_without_value(exc), param=parameter)
    if module.startswith("pydantic") and "ValidationError" in names:
        return validation_error(exc)
    return None


def validation_error(exc: Any) -> BadRequest:
    """A pydantic `ValidationError` as a 400 naming the field at fault
    (a validator's own error, a vLLM one with its `parameter`, is kept)."""
    error = exc.errors()[0]
    cause = error.get("ctx", {}).get("error")
    where = field_path(error.get("loc", ()))
    message = str(cause) if cause is not None else f"{where}: {error.get('msg', exc)}"
    param = getattr(cause, "parameter", None) or where
    code = "missing_required_parameter" if error.get("type") == "missing" else "invalid_value"
    return BadRequest(message, param=param, code=code)


def _without_value(exc: BaseException) -> str:
    """vLLM's message without the rejected value it appends (which echoes
    what the client sent, up to megabytes of it)."""
    return str(exc.args[0]) if exc.args else str(exc)
