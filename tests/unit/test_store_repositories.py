"""The store is the union of its repositories: no two may define the same
name, or one would silently replace the other's (a private helper included)."""

from __future__ import annotations

from collections import Counter

from inferd.control.stores.sql.repository import Repository
from inferd.control.stores.sql.store import SqlStore


def test_no_two_repositories_define_the_same_name() -> None:
    repositories = [c for c in SqlStore.__mro__ if issubclass(c, Repository)]
    repositories = [c for c in repositories if c not in (SqlStore, Repository)]
    assert len(repositories) == 9
    names = Counter(name for c in repositories for name in vars(c) if not name.startswith("__"))
    assert [name for name, count in names.items() if count > 1] == []
