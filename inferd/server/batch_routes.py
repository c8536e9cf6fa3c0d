"""The Batch API's HTTP routes, below an endpoint's URL and beside its chat
route: `{endpoint URL}/openai/v1/files...` and `.../batches...`, in OpenAI's
shapes, so that the `openai` client's `files` and `batches` calls work with
the endpoint URL + `/openai/v1` as base URL and the endpoint's token as key.
The token is checked as on the inference routes (the same 401 for every
way of not holding it); what each route does is `BatchService`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message

from inferd import COMPAT_FAMILY
from inferd.control.batches.model import Capacity, estimate
from inferd.control.batches.service import BatchService
from inferd.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from inferd.gateway.auth import Caller, TokenCheck, caller, unauthorized

BASE = "/endpoints/{endpoint_id}/" + COMPAT_FAMILY + "/v1"
# Room for the multipart framing and the purpose field around the file.
FORM_OVERHEAD_BYTES = 64 << 10
MAX_LIST = 100
BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")


class BatchRoutes:
    def __init__(
        self,
        service: BatchService,
        verifier: TokenCheck,
        clock: Callable[[], datetime],
        max_json_bytes: int,
    ) -> None:
        self.service = service
        self.verifier = verifier
        self.clock = clock
        self.max_json_bytes = max_json_bytes

    def _endpoint(self, request: Request, query: tuple[str, ...] = ()) -> str:
        """The endpoint whose token the request holds (the same 401 as the
        inference routes); a query parameter other than `query` is a 400."""
        return self._caller(request, query)[0]

    def _caller(self, request: Request, query: tuple[str, ...] = ()) -> tuple[str, Caller]:
        """The endpoint and whose token of it the request holds."""
        endpoint_id: str = request.path_params["endpoint_id"]
        header = request.headers.get("authorization")
        who = caller(self.verifier, endpoint_id, header.encode("latin-1") if header else None)
        if who is None:
            raise unauthorized()
        unknown = sorted(set(request.query_params) - set(query))
        if unknown:
            raise BadRequest(f"Unknown query parameter '{unknown[0]}'.", param=unknown[0])
        return endpoint_id, who

    # --- files ----------------------------------------------------------------------------------

    async def upload(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise UnsupportedMediaType(
                "Upload a file as multipart/form-data with the fields 'file' and 'purpose'."
            )
        limit = self.service.settings.max_file_bytes + FORM_OVERHEAD_BYTES
        body = await _bounded_body(request, limit)
        form = await _replayed(request, body).form(max_files=1, max_fields=4)
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str):
            raise BadRequest("The form has no 'file' part.", param="file")
        if not isinstance(purpose, str):
            raise BadRequest(
                "The form has no 'purpose' field; it must be 'batch'.", param="purpose"
            )
        content = await upload.read()
        await form.close()
        file = await self.service.upload(endpoint_id, upload.filename or "", purpose, content)
        return JSONResponse(file.to_openai())

    async def list_files(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request, ("purpose",))
        purpose = request.query_params.get("purpose")
        if purpose not in (None, "batch", "batch_output"):
            raise BadRequest("purpose is 'batch' or 'batch_output'.", param="purpose")
        files = [f for f in await self.service.files(endpoint_id) if purpose in (None, f.purpose)]
        return JSONResponse(
            {"object": "list", "data": [f.to_openai() for f in files], "has_more": False}
        )

    async def get_file(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        file = await self.service.file(endpoint_id, request.path_params["file_id"])
        return JSONResponse(file.to_openai())

    async def file_content(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        file, chunks = await self.service.content(endpoint_id, request.path_params["file_id"])
        return StreamingResponse(
            chunks,
            media_type="application/jsonl",
            headers={"content-length": str(file.bytes)},
        )

    async def delete_file(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        file_id = request.path_params["file_id"]
        await self.service.delete_file(endpoint_id, file_id)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    # --- batches ------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        # The batch runs as the client whose token created it.
        endpoint_id, who = self._caller(request)
        body = await _json_object(request, self.max_json_bytes)
        fields = {"input_file_id": str, "endpoint": str, "completion_window": str}
        for name, kind in fields.items():
            if not isinstance(body.get(name), kind):
                raise BadRequest(f"'{name}' is required and must be a string.", param=name)
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object of strings.", param="metadata")
        capacity = _capacity(body.get("capacity"))
        batch = await self.service.create(
            endpoint_id,
            body["input_file_id"],
            body["endpoint"],
            body["completion_window"],
            metadata,
            client=who.client,
            capacity=capacity,
        )
        return JSONResponse(batch.to_openai())

    async def get(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        batch = await self.service.get(endpoint_id, request.path_params["batch_id"])
        return JSONResponse(batch.to_openai(estimate(batch, self.clock())))

    async def page(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request, ("after", "limit"))
        after = request.query_params.get("after")
        if after is not None and not BATCH_ID.fullmatch(after):
            raise BadRequest("after must be a batch id (batch_...).", param="after")
        raw_limit = request.query_params.get("limit", "20")
        try:
            limit = int(raw_limit)
        except ValueError:
            raise BadRequest("limit must be a whole number.", param="limit") from None
        if not 1 <= limit <= MAX_LIST:
            raise BadRequest(f"limit must be between 1 and {MAX_LIST}.", param="limit")
        batches, more = await self.service.page(endpoint_id, after, limit)
        now = self.clock()
        data = [b.to_openai(estimate(b, now)) for b in batches]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    async def cancel(self, request: Request) -> Response:
        endpoint_id = self._endpoint(request)
        batch = await self.service.cancel(endpoint_id, request.path_params["batch_id"])
        return JSONResponse(batch.to_openai())

    def routes(self) -> list[Route]:
        """One route per path, whatever its methods (so that a 405 lists
        every method the path has in `Allow`)."""
        table: dict[str, dict[str, Handler]] = {
            f"{BASE}/files": {"POST": self.upload, "GET": self.list_files},
            f"{BASE}/files/{{file_id}}": {"GET": self.get_file, "DELETE": self.delete_file},
            f"{BASE}/files/{{file_id}}/content": {"GET": self.file_content},
            f"{BASE}/batches": {"POST": self.create, "GET": self.page},
            f"{BASE}/batches/{{batch_id}}": {"GET": self.get},
            f"{BASE}/batches/{{batch_id}}/cancel": {"POST": self.cancel},
        }
        return [
            Route(path, _by_method(handlers), methods=list(handlers))
            for path, handlers in table.items()
        ]


Handler = Callable[[Request], Awaitable[Response]]


def _capacity(value: Any) -> Capacity:
    """inferd's `capacity` field of a new batch (the `openai` client sends
    it in `extra_body`); absent or null: `wake`."""
    if value is None:
        return Capacity.WAKE
    if isinstance(value, str) and value in Capacity._value2member_map_:
        return Capacity(value)
    choices = " or ".join(f"'{c.value}'" for c in Capacity)
    raise BadRequest(
        f"capacity must be {choices}: 'wake' lets the batch wake the endpoint and keep a "
        "replica up, 'running' runs it only on replicas that are up anyway.",
        param="capacity",
    )


def _by_method(handlers: dict[str, Handler]) -> Handler:
    async def dispatch(request: Request) -> Response:
        # HEAD is GET without the body (Starlette adds it where GET is).
        handler = handlers.get(request.method) or handlers["GET"]
        return await handler(request)

    return dispatch


async def _bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The upload of {declared} bytes exceeds the limit of {limit} bytes.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The upload exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def _replayed(request: Request, body: bytes) -> Request:
    """The request again, its body read already (so the form parser sees
    at most what the limit let through)."""
    done = False

    async def receive() -> Message:
        nonlocal done
        if done:
            return {"type": "http.disconnect"}
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


async def _json_object(request: Request, limit: int) -> dict[str, Any]:
    body = await _bounded_body(request, limit)
    try:
        data = json.loads(body)
    except ValueError:
        raise BadRequest("The body is not valid JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("The body must be a JSON object.", code="invalid_json")
    return data
