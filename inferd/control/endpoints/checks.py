"""The endpoint service's checks of a request that need no state, and the
errors it answers with (one wording for each, wherever it is raised)."""

from __future__ import annotations

from inferd.errors import BadRequest, Conflict, NotFound


def not_found(endpoint_id: str) -> NotFound:
    # Also the answer for another project's endpoint, and for an id that is
    # not a UUID at all: to a client all are "no such endpoint".
    return NotFound(f"No endpoint with id '{endpoint_id}'.", param="id")


def model_not_usable(name: str, project_id: str) -> BadRequest:
    # The same answer whether the model exists in another project or
    # nowhere: another project's models are not revealed.
    return BadRequest(
        f"Unknown model '{name}': not a model of GET /inference/models that project "
        f"'{project_id}' can use.",
        param="modelName",
        code="model_not_found",
    )


def name_taken(name: str, project_id: str) -> Conflict:
    return Conflict(
        f"An endpoint named '{name}' already exists in project '{project_id}'.",
        param="name",
        code="name_taken",
    )


def check_scaling(min_replicas: int, max_replicas: int, cap: int) -> None:
    if min_replicas > cap:
        raise BadRequest(
            f"minReplicas {min_replicas} is above this server's cap of {cap} replicas.",
            param="minReplicas",
            code="min_replicas_above_cap",
        )
    if max_replicas > cap:
        raise BadRequest(
            f"maxReplicas {max_replicas} is above this server's cap of {cap}.",
            param="maxReplicas",
            code="max_replicas_above_cap",
        )
    if min_replicas > max_replicas:
        raise BadRequest(
            f"minReplicas ({min_replicas}) must not exceed maxReplicas ({max_replicas}).",
            param="minReplicas",
            code="min_above_max",
        )
