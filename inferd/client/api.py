"""A small synchronous client of the management API (used by the CLI and tests)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

DEFAULT_API_URL = "http://127.0.0.1:8080"
_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


# A list's query: names to values, or pairs (a name may repeat).
Query = Mapping[str, str] | Sequence[tuple[str, str]]


def _pairs(params: Query) -> list[tuple[str, str]]:
    return list(params.items()) if isinstance(params, Mapping) else list(params)


class ApiError(Exception):
    """An error answer of the API, in the one error shape (or a transport failure)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def __str__(self) -> str:
        details = [f"HTTP {self.status}"] if self.status else []
        if self.param:
            details.append(f"param: {self.param}")
        if self.code:
            details.append(f"code: {self.code}")
        return f"{self.message} ({', '.join(details)})" if details else self.message


class ManagementClient:
    def __init__(
        self,
        api_url: str = DEFAULT_API_URL,
        admin_key: str | None = None,
        *,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        # A client passed in (tests, a shared pool) belongs to the caller.
        self._owns_http = http is None
        self._http = http or httpx.Client(base_url=api_url.rstrip("/"), timeout=timeout)
        self.api_url = api_url

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, "/inference" + path, headers=self._headers, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the inferd API at {self.api_url}: {exc}") from None
        if resp.status_code == 204:
            return None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.is_success:
            return body
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            raise ApiError(
                str(err.get("message")),
                status=resp.status_code,
                param=err.get("param"),
                code=err.get("code"),
            )
        raise ApiError(f"unexpected answer: {resp.text[:200]}", status=resp.status_code)

    # --- endpoints -------------------------------------------------------------------

    def create_endpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/endpoints", json=body)
        return result

    def page(self, path: str, params: Query) -> tuple[list[Any], str | None]:
        """One page of a list and its `continue` cursor (None: the last page)."""
        body = self._call("GET", path, params=_pairs(params))
        return list(body["data"]), body.get("continue")

    def walk(self, path: str, params: Query | None = None) -> Iterator[Any]:
        """Every item of a list, page after page (`params`: its filters)."""
        query = _pairs(params or {})
        cursor: str | None = None
        while True:
            items, cursor = self.page(path, query + ([("continue", cursor)] if cursor else []))
            yield from items
            if cursor is None:
                return

    def list_endpoints(
        self, project_id: str | None = None, **filters: str | None
    ) -> list[dict[str, Any]]:
        """Every endpoint the key sees (all pages); `filters`: status,
        modelName, locationName, namePrefix."""
        params = {k: v for k, v in {"projectId": project_id, **filters}.items() if v}
        return list(self.walk("/endpoints", params))

    def get_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/endpoints/{endpoint_id}")
        return result

    def update_endpoint(self, endpoint_id: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PATCH", f"/endpoints/{endpoint_id}", json=body)
        return result

    def delete_endpoint(self, endpoint_id: str) -> None:
        self._call("DELETE", f"/endpoints/{endpoint_id}")

    def new_access_token(self, endpoint_id: str) -> str:
        result: dict[str, Any] = self._call("POST", f"/endpoints/{endpoint_id}/access-token")
        return str(result["accessToken"])

    # --- models ----------------------------------------------------------------------

    def register_model(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/models", json=body)
        return result

    def list_models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/models")["data"]
        return result

    def get_model(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/models/{name}")
        return result

    def delete_model(self, name: str) -> None:
        self._call("DELETE", f"/models/{name}")

    def record_profile(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/models/{name}/profiles", json=body)
        return result

    def recommendations(self, params: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/recommendations", params=params)
        return result

    def resolve(self, id_or_name: str, project_id: str | None = None) -> str:
        """An endpoint id from an id or a name (names are unique per project:
        a name in several of the caller's projects needs `project_id`)."""
        if _UUID_RE.match(id_or_name):
            return id_or_name.lower()
        found = [r for r in self.list_endpoints(project_id) if r["name"] == id_or_name]
        if len(found) == 1:
            return str(found[0]["id"])
        if found:
            projects = ", ".join(sorted(str(r.get("projectId")) for r in found))
            raise ApiError(
                f"endpoint name '{id_or_name}' is in several projects ({projects}); "
                "name the project (--project)",
                status=409,
                code="ambiguous_name",
            )
        raise ApiError(f"no endpoint named '{id_or_name}'", status=404, code="not_found")

    # --- accounts ----------------------------------------------------------------------

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Any management call below /inference; the answer's JSON (None for 204)."""
        return self._call(method, path, **kwargs)
