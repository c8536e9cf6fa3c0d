"""Accounts: projects, members with roles, management keys, quotas, the
audit log, usage and cost."""
