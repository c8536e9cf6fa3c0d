"""Accounts: projects, members with roles, management keys, quotas, the
audit log, usage and cost.

The service layer, for every surface (REST routes, CLI, console), is built
by `inferd.server.compose.build` (`Server.accounts`, a `plane.Accounts`) and
takes the acting `roles.Principal` on every call:

- `Accounts.resolver.resolve(authorization header)` -> Principal (cached;
  revocation and membership changes drop the cache at once, here and on
  other instances through the store's change feed);
- `Accounts.service` (`service.AccountService`): projects, quotas, members,
  users and their keys, the audit log;
- `Accounts.usage` (`usage_reads.UsageReads`): usage and cost of an
  endpoint or a project, as the principal may read them.

Endpoints as the principal may see and change them (404 across projects,
403 by role, quotas, audit entries, `costSoFar`) are the one endpoint
service's (`inferd.control.endpoints.service`); `project_guard` keeps a
quota check and the write it allows from interleaving with another.

Pure policies: `roles` (who may do what), `quota` (settings checks and the
autoscaling cap), `metering.split_hours`.
"""
