"""Routes of the accounts API below `/inference`: projects, members, users
and their keys, quotas, the audit log and usage. HTTP only: parse, call the
account service with the caller's principal, map the result."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api import accounts as wire
from inferd.api.accounts import (
    CreateKeyRequest,
    CreateProjectRequest,
    CreateUserRequest,
    PutMemberRequest,
    QuotaBody,
)
from inferd.control.accounts.model import (
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    UsageKey,
    UsageRow,
    UsageTotals,
    User,
    rfc3339,
)
from inferd.control.accounts.project_deletion import ProjectDeletion
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Action, Principal, Role
from inferd.control.accounts.service import AccountService, CreatedKey, key_info
from inferd.control.accounts.usage_reads import UsageReads
from inferd.control.paging import page_of
from inferd.errors import BadRequest
from inferd.http import read_model
from inferd.server.access import Operation, Target
from inferd.server.docs import Answer, Doc, Param, ok
from inferd.server.paging import (
    PAGE_PARAMS,
    filter_value,
    next_cursor,
    paged_body,
    read_key_page,
    read_page,
)

MEMBER_FILTERS = ("role",)
_ROLES = tuple(r.value for r in Role)


def parse_time(request: Request, name: str) -> datetime | None:
    text = request.query_params.get(name)
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise BadRequest(
            f"Query parameter '{name}' must be an RFC 3339 time with a zone "
            "(for example 2026-01-01T00:00:00Z).",
            param=name,
            code="invalid_time",
        )
    return at


def _quota(body: QuotaBody | None, gpu_types: Collection[str], param: str = "gpus") -> Quota:
    """The quota a body asks for. A GPU type the catalog does not have would
    limit nothing (no endpoint can use it): refused, with the known ones."""
    if body is None:
        return Quota()
    unknown = sorted(set(body.gpus) - set(gpu_types))
    if unknown:
        raise BadRequest(
            f"Unknown GPU type(s) in the quota: {', '.join(unknown)}. GPU types: "
            f"{', '.join(sorted(gpu_types))} (GET /inference/gpu-types).",
            param=param,
            code="unknown_gpu_type",
        )
    return Quota(endpoints=body.endpoints, replicas=body.replicas, gpus=dict(body.gpus))


def project_info(project: Project, principal: Principal) -> dict[str, Any]:
    role = principal.role_in(project.id)
    return {
        "id": project.id,
        "createdAt": rfc3339(project.created_at),
        "quota": project.quota.to_dict(),
        "quotaLimit": project.limit.to_dict(),
        "quotaInForce": project.quota_in_force.to_dict(),
        "role": None if role is None else role.value,
    }


def member_info(m: Membership) -> dict[str, Any]:
    return {"userId": m.user_id, "role": m.role.value, "createdAt": rfc3339(m.created_at)}


def user_info(u: User) -> dict[str, Any]:
    return {"id": u.id, "createdAt": rfc3339(u.created_at)}


def created_key_info(created: CreatedKey) -> dict[str, Any]:
    return {**key_info(created.key), "key": created.plaintext}


def audit_info(e: AuditEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": rfc3339(e.at),
        "projectId": e.project_id,
        "actor": e.actor,
        "action": e.action.value,
        "target": e.target,
        "detail": dict(e.detail),
    }


def usage_document(rows: list[UsageRow], currency: str, totals: UsageTotals) -> dict[str, Any]:
    """A page of hourly rows and the totals of the whole window (every page)."""
    data = [
        {
            "endpointId": r.endpoint_id,
            "projectId": r.project_id,
            "hour": rfc3339(r.hour),
            "gpuType": r.gpu_type,
            "gpuCount": r.gpu_count,
            "replicaSeconds": round(r.replica_seconds, 3),
            "requests": r.requests,
            "promptTokens": r.prompt_tokens,
            "completionTokens": r.completion_tokens,
            "images": r.images,
            "cost": round(r.cost, 6),
        }
        for r in rows
    ]
    summed = {
        "replicaSeconds": round(totals.replica_seconds, 3),
        "requests": totals.requests,
        "promptTokens": totals.prompt_tokens,
        "completionTokens": totals.completion_tokens,
        "images": totals.images,
        "cost": round(totals.cost, 6),
    }
    return {"currency": currency, "totals": summed, "data": data}


def _usage_position(after: str | None) -> UsageKey | None:
    """A usage page's position: the hour, endpoint, GPU type and count of the
    last row of the page before."""
    if after is None:
        return None
    try:
        hour, key_id, gpu_type, gpu_count = json.loads(after)
        at = datetime.fromisoformat(hour)
        if at.tzinfo is None or not isinstance(gpu_count, int):
            raise ValueError(after)
        return at, str(key_id), str(gpu_type), gpu_count
    except (ValueError, TypeError):
        raise BadRequest(
            "The 'continue' value is not a cursor of this list.",
            param="continue",
            code="invalid_cursor",
        ) from None


def _key_position(after: str | None) -> tuple[datetime, str] | None:
    """A keys page's position: the created-at (to the microsecond) and id
    of the last key of the page before."""
    if after is None:
        return None
    at, _, key_id = after.partition("|")
    try:
        created = datetime.fromisoformat(at)
    except ValueError:
        created = None
    if created is None or created.tzinfo is None or not key_id:
        raise BadRequest(
            "The 'continue' value is not a cursor of this list.",
            param="continue",
            code="invalid_cursor",
        )
    return created, key_id


class AccountRoutes:
    def __init__(
        self,
        accounts: AccountService,
        deletion: ProjectDeletion,
        usage: UsageReads,
        currency: Callable[[], str],
        max_body_bytes: int,
        gpu_types: Callable[[], Collection[str]],
    ) -> None:
        self.accounts = accounts
        self.deletion = deletion
        self.usage = usage
        self.currency = currency
        self.max_body_bytes = max_body_bytes
        self.gpu_types = gpu_types

    async def whoami(self, request: Request, principal: Principal) -> Response:
        roles = {p: r.value for p, r in principal.roles.items()}
        return JSONResponse(
            {
                "id": principal.id,
                "operator": principal.operator,
                "roles": roles,
                "keyProjectId": principal.scope,
            }
        )

    # --- projects ------------------------------------------------------------------------

    async def list_projects(self, request: Request, principal: Principal) -> Response:
        projects = await self.accounts.projects(principal)
        return JSONResponse({"data": [project_info(p, principal) for p in projects]})

    async def create_project(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, CreateProjectRequest, self.max_body_bytes)
        project = await self.accounts.create_project(
            principal,
            req.id,
            _quota(req.quota, self.gpu_types(), "quota.gpus"),
            _quota(req.quotaLimit, self.gpu_types(), "quotaLimit.gpus"),
        )
        return JSONResponse(project_info(project, principal), status_code=201)

    async def get_project(self, request: Request, principal: Principal) -> Response:
        project = await self.accounts.project(principal, request.path_params["id"])
        return JSONResponse(project_info(project, principal))

    async def delete_project(self, request: Request, principal: Principal) -> Response:
        await self.deletion.delete(principal, request.path_params["id"])
        return Response(status_code=204)

    # Each quota is read where it is written: the same shape as the PUT's body.
    async def get_quota(self, request: Request, principal: Principal) -> Response:
        project = await self.accounts.project(principal, request.path_params["id"])
        return JSONResponse(project.quota.to_dict())

    async def get_limit(self, request: Request, principal: Principal) -> Response:
        project = await self.accounts.project(principal, request.path_params["id"])
        return JSONResponse(project.limit.to_dict())

    async def set_quota(self, request: Request, principal: Principal) -> Response:
        return await self._put_quota(request, principal, self.accounts.set_quota)

    async def set_limit(self, request: Request, principal: Principal) -> Response:
        return await self._put_quota(request, principal, self.accounts.set_quota_limit)

    async def _put_quota(
        self,
        request: Request,
        principal: Principal,
        setter: Callable[[Principal, str, Quota], Awaitable[Project]],
    ) -> Response:
        project_id = request.path_params["id"]
        await self.accounts.project(principal, project_id)  # 404 before a 400 about the body
        req = await read_model(request, QuotaBody, self.max_body_bytes)
        project = await setter(principal, project_id, _quota(req, self.gpu_types()))
        return JSONResponse(project_info(project, principal))

    # --- members -------------------------------------------------------------------------

    async def list_members(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["id"]
        role = filter_value(request, "role")
        if role is not None and role not in _ROLES:
            raise BadRequest(
                f"Unknown role '{role}'; one of: {', '.join(_ROLES)}.",
                param="role",
                code="invalid_value",
            )
        query = {"projectId": project_id, "role": role}
        page = read_key_page(request, "members", query)
        # The role filter is applied to each page read by keyset (a project
        # has few members; a page may be short, its cursor goes on).
        members = await self.accounts.members(
            principal, project_id, after=page.after, limit=page.limit + 1
        )
        more = len(members) > page.limit
        members = members[: page.limit]
        after = members[-1].user_id if more else None
        data = [member_info(m) for m in members if role is None or m.role.value == role]
        return JSONResponse(paged_body(data, "members", query, after))

    async def get_member(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        member = await self.accounts.member(principal, params["id"], params["userId"])
        return JSONResponse(member_info(member))

    async def put_member(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, PutMemberRequest, self.max_body_bytes)
        member, created = await self.accounts.put_member(
            principal, request.path_params["id"], request.path_params["userId"], Role(req.role)
        )
        body = {
            "member": member_info(member),
            "createdKey": created_key_info(created) if created else None,
        }
        return JSONResponse(body, status_code=201 if created else 200)

    async def remove_member(self, request: Request, principal: Principal) -> Response:
        await self.accounts.remove_member(
            principal, request.path_params["id"], request.path_params["userId"]
        )
        return Response(status_code=204)

    # --- users and keys ------------------------------------------------------------------------

    async def list_users(self, request: Request, principal: Principal) -> Response:
        users = await self.accounts.users(principal)
        return JSONResponse({"data": [user_info(u) for u in users]})

    async def create_user(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, CreateUserRequest, self.max_body_bytes)
        user, created = await self.accounts.create_user(principal, req.id)
        body = {"user": user_info(user), "createdKey": created_key_info(created)}
        return JSONResponse(body, status_code=201)

    async def list_keys(self, request: Request, principal: Principal) -> Response:
        user_id = request.path_params["userId"]
        query = {"userId": user_id}
        page = read_key_page(request, "keys", query)
        keys, last = await self.accounts.keys(
            principal, user_id, after=_key_position(page.after), limit=page.limit
        )
        pending = self.accounts.resolver.pending_last_used
        data = [key_info(k, pending(k.id)) for k in keys]
        after = None if last is None else f"{last.created_at.isoformat()}|{last.id}"
        return JSONResponse(paged_body(data, "keys", query, after))

    async def create_key(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, CreateKeyRequest, self.max_body_bytes)
        created = await self.accounts.create_key(
            principal, request.path_params["userId"], req.name, req.projectId
        )
        return JSONResponse(created_key_info(created), status_code=201)

    async def revoke_key(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        await self.accounts.revoke_key(principal, params["userId"], params["keyId"])
        return Response(status_code=204)

    # --- audit and usage ---------------------------------------------------------------------

    async def audit(self, request: Request, principal: Principal) -> Response:
        actions = []
        for name in request.query_params.getlist("action"):
            try:
                actions.append(AuditAction(name))
            except ValueError:
                known = ", ".join(a.value for a in AuditAction)
                raise BadRequest(
                    f"Unknown action '{name}'; one of: {known}.",
                    param="action",
                    code="invalid_action",
                ) from None
        project_id = request.path_params["id"]
        query = {"projectId": project_id, "from": request.query_params.get("from"),
                 "to": request.query_params.get("to"),
                 "action": ",".join(sorted(a.value for a in actions)) or None}  # fmt: skip
        page = read_page(request, "audit", query)
        entries = await self.accounts.audit(
            principal,
            project_id,
            since=parse_time(request, "from"),
            until=parse_time(request, "to"),
            actions=actions,
            limit=page.limit + 1,  # one more only says that more follow
            after=page.after,
        )
        found = page_of([(e.id, e) for e in entries], page.limit)
        return JSONResponse(
            paged_body([audit_info(e) for e in found.items], "audit", query, found.after)
        )

    async def project_usage(self, request: Request, principal: Principal) -> Response:
        return await self._usage(request, principal, project_id=request.path_params["id"])

    async def endpoint_usage(self, request: Request, principal: Principal) -> Response:
        return await self._usage(request, principal, endpoint_id=request.path_params["id"])

    async def _usage(
        self,
        request: Request,
        principal: Principal,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
    ) -> Response:
        query = {"endpointId": endpoint_id, "projectId": project_id,
                 "from": request.query_params.get("from"),
                 "to": request.query_params.get("to")}  # fmt: skip
        page = read_key_page(request, "usage", query)
        rows, after, totals = await self.usage.usage_page(
            principal,
            endpoint_id=endpoint_id,
            project_id=project_id,
            since=parse_time(request, "from"),
            until=parse_time(request, "to"),
            after=_usage_position(page.after),
            limit=page.limit,
        )
        body = usage_document(rows, self.currency(), totals)
        if after is not None:
            hour, key_id, gpu_type, gpu_count = after
            position = json.dumps([hour.isoformat(), key_id, gpu_type, gpu_count])
            body["continue"] = next_cursor("usage", query, position)
        return JSONResponse(body)


# --- the route table ------------------------------------------------------------------

R, W, M = Action.READ, Action.WRITE, Action.MANAGE
_TIME = {"type": "string", "format": "date-time"}
_SPAN = {
    "from": Param("RFC 3339 time with a zone; usage: from the start of its hour.", _TIME),
    "to": Param("RFC 3339 time with a zone (exclusive).", _TIME),
}
_AUDIT_QUERY = {
    **_SPAN,
    "action": Param(
        "Only these actions (repeatable).",
        {"type": "array", "items": {"type": "string", "enum": [a.value for a in AuditAction]}},
    ),
}
_PROJECT_ANSWER = ok(200, "The project.", wire.ProjectInfo)
_USAGE_ANSWER = "A page of usage by hour and endpoint; totals of the whole window."

OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/whoami", Target.ANY, R, AccountRoutes.whoami,
              doc=Doc("whoAmI", "The caller: user id and roles, or the operator",
                      ok(200, "The caller.", wire.WhoAmI))),
    Operation("GET", "/projects", Target.ANY, R, AccountRoutes.list_projects,
              doc=Doc("listProjects", "Projects the caller belongs to (every one: the operator)",
                      ok(200, "Projects.", wire.ProjectList))),
    Operation("POST", "/projects", Target.OPERATOR, M, AccountRoutes.create_project,
              doc=Doc("createProject", "Create a project (operator)",
                      ok(201, "The project.", wire.ProjectInfo), (400, 403, 409, 413),
                      body=wire.CreateProjectRequest)),
    Operation("GET", "/projects/{id}", Target.PROJECT, R, AccountRoutes.get_project,
              doc=Doc("getProject", "A project with its quota and the caller's role",
                      _PROJECT_ANSWER, (404,))),
    Operation("DELETE", "/projects/{id}", Target.OPERATOR, M, AccountRoutes.delete_project,
              doc=Doc("deleteProject", "Delete an empty project (operator); its audit "
                      "entries and usage stay", ok(204, "Deleted."), (403, 404, 409))),
    Operation("GET", "/projects/{id}/quota", Target.PROJECT, R, AccountRoutes.get_quota,
              doc=Doc("getQuota", "A project's own quota, as its admins set it (null: "
                      "unlimited); quotaInForce on the project is what is enforced",
                      ok(200, "The quota.", wire.QuotaInfo), (404,))),
    Operation("PUT", "/projects/{id}/quota", Target.PROJECT, M, AccountRoutes.set_quota,
              doc=Doc("setQuota", "Set a project's own quota (its admins, within the "
                      "operator's limit; the operator)", _PROJECT_ANSWER, (400, 403, 404, 413),
                      body=wire.QuotaBody)),
    Operation("GET", "/projects/{id}/quota-limit", Target.PROJECT, R, AccountRoutes.get_limit,
              doc=Doc("getQuotaLimit", "The operator's limit over a project's quota (null: "
                      "unlimited)", ok(200, "The limit.", wire.QuotaInfo), (404,))),
    Operation("PUT", "/projects/{id}/quota-limit", Target.OPERATOR, M, AccountRoutes.set_limit,
              doc=Doc("setQuotaLimit", "Set the operator's limit over a project's quota "
                      "(operator)", _PROJECT_ANSWER, (400, 403, 404, 413),
                      body=wire.QuotaBody)),
    Operation("GET", "/projects/{id}/members", Target.PROJECT, R, AccountRoutes.list_members,
              (*MEMBER_FILTERS, *PAGE_PARAMS),
              doc=Doc("listMembers", "Members and their roles",
                      ok(200, "A page of members, by user id.", wire.MemberList), (400, 404))),
    Operation("GET", "/projects/{id}/members/{userId}", Target.PROJECT, R,
              AccountRoutes.get_member,
              doc=Doc("getMember", "A member's role",
                      ok(200, "The membership.", wire.MemberInfo), (404,))),
    Operation("PUT", "/projects/{id}/members/{userId}", Target.PROJECT, M,
              AccountRoutes.put_member,
              doc=Doc("putMember", "Add a member or change their role (a new user gets a "
                      "first key, shown once)",
                      (Answer(200, "The membership.", wire.MemberAdded),
                       Answer(201, "A new user, with a first key.", wire.MemberAdded)),
                      (400, 403, 404, 413), body=wire.PutMemberRequest)),
    Operation("DELETE", "/projects/{id}/members/{userId}", Target.PROJECT, M,
              AccountRoutes.remove_member,
              doc=Doc("removeMember", "Remove a member", ok(204, "Removed."), (403, 404))),
    Operation("GET", "/projects/{id}/audit", Target.PROJECT, M, AccountRoutes.audit,
              (*_AUDIT_QUERY, *PAGE_PARAMS),
              doc=Doc("getAudit", "The project's audit log (admins, operator)",
                      ok(200, "Entries, oldest first.", wire.AuditList), (400, 403, 404),
                      query=_AUDIT_QUERY)),
    Operation("GET", "/projects/{id}/usage", Target.PROJECT, R, AccountRoutes.project_usage,
              (*_SPAN, *PAGE_PARAMS),
              doc=Doc("getProjectUsage", "Hourly usage and cost of the project's endpoints",
                      ok(200, _USAGE_ANSWER, wire.UsageList), (400, 404), query=_SPAN)),
    Operation("GET", "/users", Target.OPERATOR, M, AccountRoutes.list_users,
              doc=Doc("listUsers", "Every user (operator)", ok(200, "Users.", wire.UserList),
                      (403,))),
    Operation("POST", "/users", Target.OPERATOR, M, AccountRoutes.create_user,
              doc=Doc("createUser", "Create a user with a first key (operator)",
                      ok(201, "The user and its key (shown once).", wire.CreatedUser),
                      (400, 403, 409, 413), body=wire.CreateUserRequest)),
    Operation("GET", "/users/{userId}/keys", Target.USER, R, AccountRoutes.list_keys,
              PAGE_PARAMS,
              doc=Doc("listKeys", "A user's management keys (prefix and last 4 only)",
                      ok(200, "A page of keys, oldest first.", wire.KeyList), (400, 404))),
    Operation("POST", "/users/{userId}/keys", Target.USER, W, AccountRoutes.create_key,
              doc=Doc("createKey", "Create a management key (shown once)",
                      ok(201, "The key.", wire.CreatedKeyInfo), (400, 404, 409, 413),
                      body=wire.CreateKeyRequest)),
    Operation("DELETE", "/users/{userId}/keys/{keyId}", Target.USER, W, AccountRoutes.revoke_key,
              doc=Doc("revokeKey", "Revoke a key; it fails from the next request on",
                      ok(204, "Revoked."), (404,))),
    Operation("GET", "/endpoints/{id}/usage", Target.ENDPOINT, R, AccountRoutes.endpoint_usage,
              (*_SPAN, *PAGE_PARAMS),
              doc=Doc("getEndpointUsage", "Hourly usage and cost of an endpoint",
                      ok(200, "A page of usage by hour; totals of the whole window.",
                         wire.UsageList), (400, 404), query=_SPAN)),
)  # fmt: skip
