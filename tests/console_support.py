"""Two projects and two members for the tests of scoping and roles (in-process
and in the browser), made through the management API with the operator key:
'alpha' with vera as viewer, 'beta' with olga as developer."""

from __future__ import annotations

from typing import Any, Protocol

ADMIN = "test-admin-key-0123456789"


class Client(Protocol):
    def request(self, method: str, url: str, **kwargs: Any) -> Any: ...


def seed_projects(client: Client, admin_key: str = ADMIN) -> dict[str, str]:
    """Returns each member's plaintext key by user name."""
    auth = {"Authorization": f"Bearer {admin_key}"}
    keys = {}
    for project in ("alpha", "beta"):
        answer = client.request("POST", "/inference/projects", headers=auth, json={"id": project})
        assert answer.status_code == 201, answer.text
    for project, user, role in (("alpha", "vera", "viewer"), ("beta", "olga", "developer")):
        answer = client.request(
            "PUT",
            f"/inference/projects/{project}/members/{user}",
            headers=auth,
            json={"role": role},
        )
        assert answer.status_code < 300, answer.text
        keys[user] = answer.json()["createdKey"]["key"]
    return keys
