"""A console over a control plane with two projects and three principals,
for the tests of scoping and roles (in-process and in the browser).

Endpoints named 'a-*' belong to project 'alpha', the rest to the other
project (whose name a test picks, HTML included). The keys: the admin key
(operator), a viewer of alpha, a developer of the other project."""

from __future__ import annotations

from types import MappingProxyType

from starlette.applications import Starlette

from inferd.console.app import Console
from inferd.console.principal import ConsolePrincipal, operator
from inferd.console.sources import ConsoleSources
from inferd.control.store import EndpointRow
from inferd.server.app import ControlPlane, create_app
from inferd.server.console import console_sources

ADMIN = "test-admin-key-0123456789"
VIEWER_KEY = "viewer-key-0123456789abcdef"
OTHER_KEY = "other-project-key-0123456789"


def scoped_app(plane: ControlPlane, other: str, public_url: str) -> Starlette:
    base = console_sources(plane)
    principals = {
        ADMIN: operator(),
        VIEWER_KEY: ConsolePrincipal("vera", roles=MappingProxyType({"alpha": "viewer"})),
        OTHER_KEY: ConsolePrincipal("olga", roles=MappingProxyType({other: "developer"})),
    }

    def project_of(row: EndpointRow) -> str:
        return "alpha" if row.name.startswith("a-") else other

    sources = ConsoleSources(
        service=base.service,
        catalog=base.catalog,
        authenticate=principals.get,
        public_url=public_url,
        project_of=project_of,
        projects=lambda: ["alpha", other],
    )
    return create_app(plane, extra_routes=[Console(sources).mount()])
