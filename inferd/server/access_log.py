"""What the server's access log leaves out: the replicas' own status reports,
and the gateway's requests (the gateway logs each itself, with its request
id: `inferd.gateway.access`).

Every replica reports every couple of seconds (`POST
/internal/registry/replicas/{id}`); one
access-log line each would bury the requests an operator reads the log for.
A report that was refused is still logged, and the registry logs each
replica's status changes itself (loading, ready, failed).
"""

from __future__ import annotations

import logging

from inferd.control.replicas.registry_api import REGISTRY_PATH

REPORT_PATH_PREFIX = REGISTRY_PATH + "/replicas/"
GATEWAY_PATH_PREFIX = "/endpoints/"


class QuietReplicaReports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access records: (client, method, path, http version, status)
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        if str(path).startswith(GATEWAY_PATH_PREFIX):
            return False
        is_report = method == "POST" and str(path).startswith(REPORT_PATH_PREFIX)
        return not (is_report and isinstance(status, int) and status < 400)
