"""The accounts half of the store contract, against every adapter (memory,
SQLite, a real PostgreSQL): projects and quotas, users and memberships,
management keys, the append-only audit log, hourly usage that adds up across
writers, per-project endpoint names, account changes on the change feed."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from inferd.control.accounts.model import (
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    UsageDelta,
    UsageKey,
    UsageRow,
    UsageTotals,
    User,
    UserKey,
    usage_order,
)
from inferd.control.accounts.ports import AlreadyExists
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.model import ChangeKind, DuplicateName
from inferd.control.ports import Store
from tests.contract.test_store import (
    SHARED,
    T0,
    Opener,
    collect,
    digest,
    endpoint,
    kind,
    opener,
    run,
    store_url,
)

__all__ = ["kind", "opener", "store_url"]
H0 = datetime(2025, 1, 1, 12, tzinfo=UTC)


def key(n: int, user: str = "ada", at: datetime = T0) -> UserKey:
    return UserKey(f"key_{n:04d}", user, f"key {n}", bytes([n]) * 32, f"infd_key_...{n:04d}", at)


def test_projects_and_quotas(opener: Opener) -> None:
    async def body(store: Store) -> None:
        assert [p.id for p in await store.list_projects()] == ["default"]
        team = Project("team", T0, Quota(endpoints=3, gpus={"A100": 8}))
        await store.create_project(team)
        with pytest.raises(AlreadyExists):
            await store.create_project(Project("team", T0))
        assert await store.get_project("team") == team
        assert await store.get_project("nope") is None
        quota = Quota(replicas=4, gpus={"L4": 2})
        assert await store.set_quota("team", quota)
        assert not await store.set_quota("nope", quota)
        assert (await store.get_project("team")) == replace(team, quota=quota)
        # The operator's limit is kept apart from the project's own quota.
        limit = Quota(endpoints=5, replicas=3, gpus={"L4": 1})
        assert await store.set_quota_limit("team", limit)
        assert not await store.set_quota_limit("nope", limit)
        stored = await store.get_project("team")
        assert stored == replace(team, quota=quota, limit=limit)
        assert stored is not None and stored.quota_in_force == Quota(5, 3, {"L4": 1})
        limited = Project("limited", T0, limit=Quota(replicas=2))
        await store.create_project(limited)
        assert [p for p in await store.list_projects() if p.id == "limited"] == [limited]
        # Deleting takes its memberships with it, and the user stays.
        await store.create_user(User("ada", T0))
        await store.put_membership(Membership("limited", "ada", Role.ADMIN, T0))
        assert await store.delete_project("limited")
        assert not await store.delete_project("limited")
        assert await store.get_project("limited") is None
        assert await store.memberships_of("ada") == []
        assert await store.get_user("ada") is not None

    run(body, opener())


def test_users_memberships_and_keys(opener: Opener) -> None:
    async def body(store: Store) -> None:
        await store.create_project(Project("team", T0))
        await store.create_user(User("ada", T0))
        with pytest.raises(AlreadyExists):
            await store.create_user(User("ada", T0))
        await store.put_membership(Membership("team", "ada", Role.VIEWER, T0))
        # Changing the role keeps the membership's creation time.
        await store.put_membership(Membership("team", "ada", Role.ADMIN, T0 + timedelta(hours=1)))
        assert await store.members_of("team") == [Membership("team", "ada", Role.ADMIN, T0)]
        assert [m.project_id for m in await store.memberships_of("ada")] == ["team"]
        with pytest.raises(KeyError):
            await store.put_membership(Membership("team", "nobody", Role.VIEWER, T0))

        k1, k2 = key(1), key(2, at=T0 + timedelta(seconds=1))
        await store.add_key(k1)
        await store.add_key(k2)
        with pytest.raises(AlreadyExists):
            await store.add_key(replace(k1, id="key_other"))  # same digest
        assert await store.keys_of("ada") == [k1, k2]
        assert await store.key_by_hash(k2.key_hash) == k2
        assert await store.key_by_hash(bytes(32)) is None
        later = T0 + timedelta(minutes=1)
        assert await store.revoke_key(k1.id, later)
        assert not await store.revoke_key(k1.id, later)  # once
        await store.touch_keys({k2.id: later})
        await store.touch_keys({k2.id: T0})  # an older time never wins
        assert await store.keys_of("ada") == [
            replace(k1, revoked_at=later),
            replace(k2, last_used_at=later),
        ]
        assert await store.remove_membership("team", "ada")
        assert not await store.remove_membership("team", "ada")
        assert await store.memberships_of("ada") == []

    run(body, opener())


def test_audit_log(opener: Opener) -> None:
    async def body(store: Store) -> None:
        entries = [
            AuditEntry(
                T0 + timedelta(seconds=i),
                "team" if i % 2 else "other",
                "operator",
                action,
                f"endpoint:{i}",
                {"n": i},
            )
            for i, action in enumerate(
                [
                    AuditAction.ENDPOINT_CREATE,
                    AuditAction.KEY_CREATE,
                    AuditAction.ENDPOINT_DELETE,
                    AuditAction.KEY_REVOKE,
                ]
            )
        ]
        stored = [await store.append_audit(e) for e in entries]
        assert [e.id for e in stored] == sorted({e.id for e in stored})  # increasing
        team = await store.audit("team")
        assert [e.target for e in team] == ["endpoint:1", "endpoint:3"]
        assert team[0] == replace(entries[1], id=stored[1].id)
        since = await store.audit(None, since=T0 + timedelta(seconds=2))
        assert [e.target for e in since] == ["endpoint:2", "endpoint:3"]
        until = await store.audit(None, until=T0 + timedelta(seconds=1))
        assert [e.target for e in until] == ["endpoint:0"]
        by_action = await store.audit(None, actions=[AuditAction.KEY_REVOKE])
        assert [e.target for e in by_action] == ["endpoint:3"]
        assert len(await store.audit(None, limit=2)) == 2

    run(body, opener())


def test_audit_pages_hold_every_entry_once_while_appends_go_on(kind: str, opener: Opener) -> None:
    """Keyset pages of the audit log (past the last id seen): with another
    writer appending meanwhile, every entry of the walk's start is read once,
    in order, and a filter holds on every page."""

    async def body(reader: Store, writer: Store) -> None:
        def entry(i: int) -> AuditEntry:
            action = AuditAction.KEY_CREATE if i % 3 == 0 else AuditAction.ENDPOINT_CREATE
            return AuditEntry(T0 + timedelta(seconds=i), "team", "operator", action, f"t:{i}", {})

        for i in range(25):
            await writer.append_audit(entry(i))
        before = [e.id for e in await reader.audit("team")]
        assert len(before) == 25

        async def more() -> None:
            for i in range(25, 60):
                await writer.append_audit(entry(i))
                await asyncio.sleep(0)

        appending = asyncio.create_task(more())
        seen: list[int] = []
        after: int | None = None
        while True:
            page = await reader.audit("team", limit=4, after=after)
            seen += [e.id for e in page]
            if len(page) < 4:
                break
            after = page[-1].id
        await appending
        assert len(seen) == len(set(seen))
        assert seen[: len(before)] == before and seen == sorted(seen)
        keys = await reader.audit(
            "team", actions=[AuditAction.KEY_CREATE], limit=3, after=before[2]
        )
        assert [e.target for e in keys] == ["t:3", "t:6", "t:9"]

    reader = opener()
    run(body, reader, opener() if kind in SHARED else reader)


def test_member_pages_by_user_id_under_concurrent_changes(kind: str, opener: Opener) -> None:
    async def body(reader: Store, writer: Store) -> None:
        await writer.create_project(Project("team", T0))
        await writer.create_project(Project("other", T0))
        names = [f"u{i:02d}" for i in range(30)]
        for name in names:
            await writer.create_user(User(name, T0))
            await writer.put_membership(Membership("team", name, Role.VIEWER, T0))
        await writer.put_membership(Membership("other", "u05", Role.ADMIN, T0))
        stable = [n for i, n in enumerate(names) if i % 3]
        leaving = [n for i, n in enumerate(names) if not i % 3]

        async def churn() -> None:
            for name in leaving:
                await writer.remove_membership("team", name)
                await writer.create_user(User(f"{name}-new", T0))
                await writer.put_membership(Membership("team", f"{name}-new", Role.VIEWER, T0))
                await asyncio.sleep(0)

        churning = asyncio.create_task(churn())
        seen: list[str] = []
        after: str | None = None
        while True:
            page = await reader.members_of("team", after=after, limit=4)
            assert all(m.project_id == "team" for m in page)
            seen += [m.user_id for m in page]
            if len(page) < 4:
                break
            after = page[-1].user_id
            await asyncio.sleep(0)
        await churning
        assert len(await reader.members_of("team")) == 30  # the churn ran to its end
        assert seen == sorted(seen) and len(seen) == len(set(seen))
        assert [n for n in seen if n in stable] == stable
        assert await reader.members_of("team", after="u28") == [
            Membership("team", "u29", Role.VIEWER, T0)
        ]

    reader = opener()
    run(body, reader, opener() if kind in SHARED else reader)


def test_key_pages_by_creation_under_concurrent_adds(kind: str, opener: Opener) -> None:
    """Keys page by (created at, id): ties in time are broken by id, times to
    the store's precision (milliseconds in SQLite, microseconds in PostgreSQL)."""

    async def body(reader: Store, writer: Store) -> None:
        await writer.create_user(User("ada", T0))
        await writer.create_user(User("bob", T0))
        # Pairs share a time (the id breaks the tie); a millisecond apart.
        times = [T0 + timedelta(milliseconds=n // 2) for n in range(20)]
        for n, at in enumerate(times, start=1):
            await writer.add_key(key(n, at=at))
        await writer.add_key(key(99, "bob"))
        before = [k.id for k in await reader.keys_of("ada")]
        assert len(before) == 20

        async def more() -> None:
            for n in range(21, 40):
                await writer.add_key(key(n, at=T0 + timedelta(minutes=1, milliseconds=n)))
                await asyncio.sleep(0)

        adding = asyncio.create_task(more())
        seen: list[str] = []
        after: tuple[datetime, str] | None = None
        while True:
            page = await reader.keys_of("ada", after=after, limit=3)
            assert all(k.user_id == "ada" for k in page)
            seen += [k.id for k in page]
            if len(page) < 3:
                break
            after = (page[-1].created_at, page[-1].id)
            await asyncio.sleep(0)
        await adding
        assert len(seen) == len(set(seen))
        assert seen[:20] == before

    reader = opener()
    run(body, reader, opener() if kind in SHARED else reader)


def usage(hour: datetime, **figures: float) -> UsageDelta:
    return UsageDelta("e1", "team", hour, "A100", 2, **figures)  # type: ignore[arg-type]


def test_usage_adds_up(opener: Opener) -> None:
    async def body(store: Store) -> None:
        h1 = H0 + timedelta(hours=1)
        await store.add_usage([usage(H0, replica_seconds=10.5, requests=2, cost=0.5)])
        await store.add_usage([usage(H0, replica_seconds=1.5, prompt_tokens=7, images=1),
                               usage(h1, completion_tokens=3, cost=0.25)])  # fmt: skip
        await store.add_usage([])
        rows = await store.usage(endpoint_id="e1")
        assert rows == [
            usage(H0, replica_seconds=12.0, requests=2, prompt_tokens=7, images=1, cost=0.5),
            usage(h1, completion_tokens=3, cost=0.25),
        ]
        assert await store.usage(project_id="team", since=h1) == [rows[1]]
        assert await store.usage(project_id="team", until=h1) == [rows[0]]
        assert await store.usage(project_id="other") == []
        assert await store.costs_since(H0) == {"e1": 0.75}
        assert await store.costs_since(h1 + timedelta(hours=1)) == {}

    run(body, opener())


def test_usage_pages_and_totals(opener: Opener) -> None:
    """Keyset pages in (hour, endpoint, GPU type, count) order: ties on the
    hour broken by the endpoint, then the GPU type and count; the totals
    sum the whole window in the database."""

    async def body(store: Store) -> None:
        deltas = [
            UsageDelta(e, "team", H0 + timedelta(hours=h), gpu, count, requests=1, cost=0.5)
            for h in range(3)
            for e in ("e1", "e2")
            for gpu, count in (("A100", 1), ("A100", 2), ("L4", 1))
        ]
        await store.add_usage(list(reversed(deltas)))
        await store.add_usage([UsageDelta("x", "other", H0, "A100", 1, requests=5)])
        whole = await store.usage(project_id="team")
        assert len(whole) == 18 and whole == sorted(whole, key=usage_order)
        seen: list[UsageRow] = []
        after: UsageKey | None = None
        while True:
            page = await store.usage(project_id="team", after=after, limit=4)
            seen += page
            if len(page) < 4:
                break
            after = usage_order(page[-1])
        assert seen == whole
        window = await store.usage(project_id="team", since=H0 + timedelta(hours=1), limit=5)
        assert [usage_order(r)[0] for r in window] == [H0 + timedelta(hours=1)] * 5
        totals = await store.usage_totals(project_id="team", since=H0 + timedelta(hours=1))
        assert (totals.requests, totals.cost) == (12, 6.0)
        assert (await store.usage_totals(endpoint_id="e1")).requests == 9
        assert await store.usage_totals(project_id="nobody") == UsageTotals()

    run(body, opener())


@pytest.mark.parametrize("kind", SHARED, indirect=True)
def test_usage_of_two_writers_adds_up(opener: Opener) -> None:
    """Two instances sharing one database: their figures add, none is lost."""

    async def body(a: Store, b: Store) -> None:
        await asyncio.gather(
            *(
                s.add_usage([usage(H0, replica_seconds=1.0, requests=1, cost=0.01)])
                for _ in range(10)
                for s in (a, b)
            )
        )
        (row,) = await a.usage(endpoint_id="e1")
        assert (row.replica_seconds, row.requests) == (20.0, 20)
        assert row.cost == pytest.approx(0.2)

    run(body, opener(), opener())


def test_endpoint_names_are_unique_per_project(opener: Opener) -> None:
    async def body(store: Store) -> None:
        await store.insert_endpoint(replace(endpoint(1, "same"), project_id="a"), digest(1))
        await store.insert_endpoint(replace(endpoint(2, "same"), project_id="b"), digest(2))
        with pytest.raises(DuplicateName):
            await store.insert_endpoint(replace(endpoint(3, "same"), project_id="a"), digest(3))

    run(body, opener())


def test_account_changes_are_on_the_feed(opener: Opener) -> None:
    async def body(store: Store) -> None:
        feed = store.changes()
        await store.create_project(Project("team", T0))
        await store.create_user(User("ada", T0))
        await store.put_membership(Membership("team", "ada", Role.VIEWER, T0))
        await store.add_key(key(1))
        await store.revoke_key("key_0001", T0)
        await store.set_quota("team", Quota(replicas=1))
        wanted = {"user:ada", "key:key_0001", "project:team"}
        seen = await collect(
            feed,
            lambda s: wanted <= {c.id for c in s if c.kind is ChangeKind.ACCOUNT},
        )
        assert all(c.kind is ChangeKind.ACCOUNT for c in seen if c.id in wanted)

    run(body, opener())
