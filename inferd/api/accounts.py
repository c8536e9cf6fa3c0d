"""Wire models of the accounts API: projects, members, keys, quotas, audit
log, usage. Requests are strict and closed, as in `inferd.api.management`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferd.api.management import NAME_PATTERN

RoleName = Literal["admin", "developer", "viewer"]
MAX_QUOTA = 1_000_000


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class QuotaBody(_Request):
    """Limits of a project; null or omitted: unlimited."""

    endpoints: int | None = Field(None, ge=0, le=MAX_QUOTA)
    replicas: int | None = Field(None, ge=0, le=MAX_QUOTA)
    gpus: dict[str, int] = Field(
        default_factory=dict,
        description="GPU type -> GPUs the project's replicas may hold of it together.",
        max_length=64,
    )


class CreateProjectRequest(_Request):
    id: str = Field(pattern=NAME_PATTERN, description="Name of the project, unique.")
    quota: QuotaBody | None = Field(None, description="The project's own quota.")
    quotaLimit: QuotaBody | None = Field(None, description="The operator's limit over it.")


class PutMemberRequest(_Request):
    role: RoleName


class CreateUserRequest(_Request):
    id: str = Field(pattern=NAME_PATTERN, description="Name of the user, unique.")


class CreateKeyRequest(_Request):
    name: str = Field(min_length=1, max_length=100, description="What the key is for.")
    projectId: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="The one project the key acts in. Omitted: for the user themself and "
        "the operator, every project of the user; for a project admin, the one project "
        "the admin shares with the user (an admin's key never acts elsewhere).",
    )


class QuotaInfo(_Response):
    endpoints: int | None
    replicas: int | None
    gpus: dict[str, int]


class ProjectInfo(_Response):
    id: str
    createdAt: str
    quota: QuotaInfo = Field(description="Set by the project's admins, within quotaLimit.")
    quotaLimit: QuotaInfo = Field(description="Set by the operator.")
    quotaInForce: QuotaInfo = Field(description="What is enforced: the lower of the two.")
    role: RoleName | None = Field(description="The caller's role; null for the operator.")


class ProjectList(_Response):
    data: list[ProjectInfo]


class MemberInfo(_Response):
    userId: str
    role: RoleName
    createdAt: str


class MemberList(_Response):
    data: list[MemberInfo]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more items follow: pass it as the `continue` query "
        "parameter, with the same filters, for the next page. Absent on the last page.",
    )


class KeyInfo(_Response):
    id: str
    userId: str
    name: str
    hint: str = Field(description="The key's prefix and its last 4 characters.")
    projectId: str | None = Field(
        description="The one project the key acts in; null: every project of its user."
    )
    createdAt: str
    lastUsedAt: str | None
    revokedAt: str | None


class KeyList(_Response):
    data: list[KeyInfo]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more items follow: pass it as the `continue` query "
        "parameter, with the same filters, for the next page. Absent on the last page.",
    )


class CreatedKeyInfo(KeyInfo):
    key: str = Field(description="The management key. Shown only in this response.")


class MemberAdded(_Response):
    member: MemberInfo
    createdKey: CreatedKeyInfo | None = Field(
        description="For a user created by this call: their first key, shown once."
    )


class UserInfo(_Response):
    id: str
    createdAt: str


class UserList(_Response):
    data: list[UserInfo]


class CreatedUser(_Response):
    user: UserInfo
    createdKey: CreatedKeyInfo


class WhoAmI(_Response):
    id: str
    operator: bool
    roles: dict[str, RoleName]
    keyProjectId: str | None = Field(
        description="The one project the key used acts in; null: every project of the user."
    )


class AuditEntryInfo(_Response):
    id: int
    at: str
    projectId: str | None
    actor: str
    action: str
    target: str
    detail: dict[str, Any]


class AuditList(_Response):
    data: list[AuditEntryInfo]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more items follow: pass it as the `continue` query "
        "parameter, with the same filters, for the next page. Absent on the last page.",
    )


class UsageInfo(_Response):
    endpointId: str
    projectId: str
    hour: str
    gpuType: str
    gpuCount: int
    replicaSeconds: float
    requests: int
    promptTokens: int
    completionTokens: int
    images: int
    cost: float


class UsageList(_Response):
    currency: str
    totals: dict[str, float]
    data: list[UsageInfo]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more rows follow: pass it as the `continue` query "
        "parameter, with the same window, for the next page. Absent on the last page.",
    )
