"""OpenAPI paths and components of the accounts routes (merged into the
server's one document by `openapi_document`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from inferd.api import accounts as wire
from inferd.control.accounts.model import AuditAction
from inferd.server.openapi import _REF, _op
from inferd.server.paging import PAGE_PARAMS, query_params

_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (wire.QuotaBody, "validation"),
    (wire.CreateProjectRequest, "validation"),
    (wire.PutMemberRequest, "validation"),
    (wire.CreateUserRequest, "validation"),
    (wire.CreateKeyRequest, "validation"),
    (wire.ProjectInfo, "serialization"),
    (wire.ProjectList, "serialization"),
    (wire.MemberList, "serialization"),
    (wire.MemberAdded, "serialization"),
    (wire.UserList, "serialization"),
    (wire.CreatedUser, "serialization"),
    (wire.KeyList, "serialization"),
    (wire.CreatedKeyInfo, "serialization"),
    (wire.WhoAmI, "serialization"),
    (wire.AuditList, "serialization"),
    (wire.UsageList, "serialization"),
]


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


_PROJECT = _path("id", "Project id (its name).")
_ENDPOINT = _path("id", "Endpoint id (UUID).")
_USER = _path("userId", "User id (its name).")
_KEY = _path("keyId", "Management key id.")
_TIME_RANGE = [
    {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "string", "format": "date-time"},
    }
    for name, description in (
        ("from", "RFC 3339 time with a zone; usage: from the start of its hour."),
        ("to", "RFC 3339 time with a zone (exclusive)."),
    )
]
_ACTION = {
    "name": "action",
    "in": "query",
    "required": False,
    "description": "Only these actions (repeatable).",
    "schema": {
        "type": "array",
        "items": {"type": "string", "enum": [a.value for a in AuditAction]},
    },
    "style": "form",
    "explode": True,
}


def accounts_openapi() -> dict[str, Any]:
    _, top = models_json_schema(_MODELS, ref_template=_REF)
    paths: dict[str, Any] = {
        "/inference/whoami": {
            "get": _op("whoAmI", "The caller: user id and roles, or the operator",
                       (200, "WhoAmI", "The caller."), ())
        },
        "/inference/projects": {
            "get": _op("listProjects", "Projects the caller belongs to (every one: the operator)",
                       (200, "ProjectList", "Projects."), ()),
            "post": _op("createProject", "Create a project (operator)",
                        (201, "ProjectInfo", "The project."), (400, 403, 409, 413),
                        body="CreateProjectRequest"),
        },
        "/inference/projects/{id}": {
            "get": _op("getProject", "A project with its quota and the caller's role",
                       (200, "ProjectInfo", "The project."), (404,), params=[_PROJECT]),
            "delete": _op("deleteProject", "Delete an empty project (operator); its audit "
                          "entries and usage stay", (204, None, "Deleted."), (403, 404, 409),
                          params=[_PROJECT]),
        },
        "/inference/projects/{id}/quota": {
            "put": _op("setQuota", "Set a project's own quota (its admins, within the "
                       "operator's limit; the operator)",
                       (200, "ProjectInfo", "The project."), (400, 403, 404, 413),
                       body="QuotaBody", params=[_PROJECT]),
        },
        "/inference/projects/{id}/quota-limit": {
            "put": _op("setQuotaLimit", "Set the operator's limit over a project's quota "
                       "(operator)", (200, "ProjectInfo", "The project."), (400, 403, 404, 413),
                       body="QuotaBody", params=[_PROJECT]),
        },
        "/inference/projects/{id}/members": {
            "get": _op("listMembers", "Members and their roles",
                       (200, "MemberList", "A page of members, by user id."), (400, 404),
                       params=[_PROJECT, *query_params(("role", *PAGE_PARAMS))]),
        },
        "/inference/projects/{id}/members/{userId}": {
            "put": _op("putMember", "Add a member or change their role (a new user gets a "
                       "first key, shown once)", (200, "MemberAdded", "The membership."),
                       (400, 403, 404, 413), body="PutMemberRequest",
                       params=[_PROJECT, _USER]),
            "delete": _op("removeMember", "Remove a member", (204, None, "Removed."),
                          (403, 404), params=[_PROJECT, _USER]),
        },
        "/inference/projects/{id}/audit": {
            "get": _op("getAudit", "The project's audit log (admins, operator)",
                       (200, "AuditList", "Entries, oldest first."), (400, 403, 404),
                       params=[_PROJECT, *_TIME_RANGE, _ACTION, *query_params(PAGE_PARAMS)]),
        },
        "/inference/projects/{id}/usage": {
            "get": _op("getProjectUsage", "Hourly usage and cost of the project's endpoints",
                       (200, "UsageList", "A page of usage by hour and endpoint; totals of "
                        "the whole window."), (400, 404),
                       params=[_PROJECT, *_TIME_RANGE, *query_params(PAGE_PARAMS)]),
        },
        "/inference/users": {
            "get": _op("listUsers", "Every user (operator)", (200, "UserList", "Users."), (403,)),
            "post": _op("createUser", "Create a user with a first key (operator)",
                        (201, "CreatedUser", "The user and its key (shown once)."),
                        (400, 403, 409, 413), body="CreateUserRequest"),
        },
        "/inference/users/{userId}/keys": {
            "get": _op("listKeys", "A user's management keys (prefix and last 4 only)",
                       (200, "KeyList", "A page of keys, oldest first."), (400, 404),
                       params=[_USER, *query_params(PAGE_PARAMS)]),
            "post": _op("createKey", "Create a management key (shown once)",
                        (201, "CreatedKeyInfo", "The key."), (400, 404, 409, 413),
                        body="CreateKeyRequest", params=[_USER]),
        },
        "/inference/users/{userId}/keys/{keyId}": {
            "delete": _op("revokeKey", "Revoke a key; it fails from the next request on",
                          (204, None, "Revoked."), (404,), params=[_USER, _KEY]),
        },
        "/inference/endpoints/{id}/usage": {
            "get": _op("getEndpointUsage", "Hourly usage and cost of an endpoint",
                       (200, "UsageList", "A page of usage by hour; totals of the whole "
                        "window."), (400, 404),
                       params=[_ENDPOINT, *_TIME_RANGE, *query_params(PAGE_PARAMS)]),
        },
    }  # fmt: skip
    # 201 for a new member is an answer of its own, with the same body.
    put_member = paths["/inference/projects/{id}/members/{userId}"]["put"]["responses"]
    put_member["201"] = {**put_member["200"], "description": "A new user, with a first key."}
    return {"paths": paths, "components": {"schemas": dict(top.get("$defs", {}))}}
