"""Roles and the authorization check: 404 outside the project, 403 for a role
that may not act, nothing for the operator."""

from __future__ import annotations

import pytest

from inferd.control.accounts.roles import (
    OPERATOR,
    Action,
    Principal,
    Role,
    authorize,
    require_operator,
)
from inferd.errors import Forbidden, NotFound

HIDDEN = NotFound("No endpoint 'x'.")

CASES = [
    (Role.VIEWER, Action.READ, None),
    (Role.VIEWER, Action.WRITE, Forbidden),
    (Role.VIEWER, Action.MANAGE, Forbidden),
    (Role.DEVELOPER, Action.READ, None),
    (Role.DEVELOPER, Action.WRITE, None),
    (Role.DEVELOPER, Action.MANAGE, Forbidden),
    (Role.ADMIN, Action.READ, None),
    (Role.ADMIN, Action.WRITE, None),
    (Role.ADMIN, Action.MANAGE, None),
]


@pytest.mark.parametrize(("role", "action", "error"), CASES)
def test_own_project(role: Role, action: Action, error: type[Exception] | None) -> None:
    user = Principal(id="u", name="u", roles={"team": role})
    assert user.may(action, "team") is (error is None)
    if error is None:
        authorize(user, "team", action, hidden=HIDDEN)
    else:
        with pytest.raises(error) as info:
            authorize(user, "team", action, hidden=HIDDEN)
        assert role.value in str(info.value)


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("role", list(Role))
def test_other_project_is_hidden(role: Role, action: Action) -> None:
    user = Principal(id="u", name="u", roles={"team": role})
    with pytest.raises(NotFound) as info:
        authorize(user, "other", action, hidden=HIDDEN)
    assert info.value is HIDDEN
    assert not user.sees("other")


@pytest.mark.parametrize("action", list(Action))
def test_operator_may_everything(action: Action) -> None:
    authorize(OPERATOR, "any", action, hidden=HIDDEN)
    require_operator(OPERATOR, "x")
    with pytest.raises(Forbidden):
        require_operator(Principal(id="u", name="u", roles={"any": Role.ADMIN}), "x")
    assert OPERATOR.label == "operator"


def test_user_keys_are_redacted_like_tokens() -> None:
    """A management key in a log line or an error body becomes `infd_key_***`."""
    from inferd.control.accounts.keys import is_user_key, key_hint, new_user_key
    from inferd.redact import redact

    key = new_user_key()
    assert is_user_key(key) and not is_user_key(key[:-1] + ("0" if key[-1] != "0" else "1"))
    assert redact(f"GET /x key={key}") == "GET /x key=infd_key_***"
    assert key_hint(key) == f"infd_key_...{key[-4:]}"
