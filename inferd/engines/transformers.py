"""Chat through plain transformers, for machines where vLLM cannot be installed.

Batching choice, measured on the tiny-chat model on this project's 2-core CPU
(transformers 5.19, torch 2.13, 8 prompts x 32 new tokens, greedy):

    model.generate_batch (the library's continuous batching)  47-82 s  (3-5 tokens/s)
    plain model.generate, the 8 prompts left-padded           0.15 s   (~1,700 tokens/s)
    plain model.generate, the 8 one after another             0.75 s   (~340 tokens/s)

The library's continuous batching is hundreds of times slower here, so this
engine batches by hand: one worker thread owns the model; it takes the
requests queued at that moment (waiting `batch_window_s`, 3 ms, for each
next one, so that a burst reaching an idle engine shares a batch; at most
`max_batch_size`), left-pads the prompts and runs one plain `generate`.
Through the engine (64 new tokens each, best of 4): 1 request ~370 tokens/s,
8 concurrent ~1,900, 16 concurrent ~2,300. A batch is static: requests
arriving while it runs wait for the next one.

Everything per request happens in two hooks of that one `generate` call:

- a logits processor that applies, row by row, `logit_bias`, `min_tokens`
  (EOS and stop tokens masked), temperature (0: greedy) and top-p, then
  draws the row's token itself and leaves only it for `generate`'s greedy
  choice. So requests with different sampling settings share a batch.
- a stopping criterion that takes each row's new token, decodes it
  incrementally (text is held back while a UTF-8 sequence is incomplete, or
  while it could be the start of a stop string), sends the delta to the
  request's queue, and ends the row at EOS (unless `ignore_eos`), at a stop
  token, at a stop string (not included in the text), at `max_tokens`, or
  when the client has gone (the generator was closed).

Requests with a `seed` run alone, so that their text does not depend on
what else was queued. Structured output (JSON schema, regex, JSON mode)
needs a grammar engine, which transformers does not have: refused with 400.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.engines import resume
from inferd.engines.base import (
    PORTABLE_SETTINGS,
    EngineLoad,
    EngineOptions,
    SamplingOptions,
    TextDelta,
    TextModelInfo,
    TextRequest,
    engine_options,
    refuse_settings,
)
from inferd.engines.chat_template import ChatPromptRenderer
from inferd.engines.limits import check_prompt_fits, check_token_ids, refuse_tools_and_logprobs
from inferd.errors import BadRequest, Conflict, ServiceUnavailable
from inferd.vocab import ModelKind

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 16
# How long the worker waits for the next request before starting a batch
# (at most four times this in all).
DEFAULT_BATCH_WINDOW_S = 0.003


@dataclass(eq=False)
class _Row:
    """One request's state, shared between its generator and the worker."""

    request: TextRequest
    prompt_ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    decoder: IncrementalDecoder
    deltas: asyncio.Queue[TextDelta | BaseException] = field(default_factory=asyncio.Queue)
    aborted: threading.Event = field(default_factory=threading.Event)
    # Worker-side state.
    sent: int = 0  # characters of the decoded text already sent
    done: bool = False

    @property
    def sampling(self) -> SamplingOptions:
        return self.request.sampling

    def send(self, item: TextDelta | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.deltas.put_nowait, item)


class IncrementalDecoder:
    """Token ids in, text out, one token at a time, the way vLLM and TGI do
    it: decode a short window of recent tokens and keep only what it adds,
    never a trailing replacement character (an incomplete UTF-8 sequence)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def _window(self) -> tuple[str, str]:
        before = self._decode(self.tokens[self._prefix_offset : self._read_offset])
        return before, self._decode(self.tokens[self._prefix_offset :])

    def add(self, token: int) -> None:
        self.tokens.append(token)
        before, after = self._window()
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.tokens)

    def flush(self) -> None:
        """At the end: whatever is left, replacement characters included."""
        before, after = self._window()
        if len(after) > len(before):
            self.text += after[len(before) :]
        self._prefix_offset = self._read_offset = len(self.tokens)


class _Batch:
    """The per-row hooks of one `generate` call (see the module docstring)."""

    def __init__(self, rows: list[_Row], prompt_width: int, eos_ids: set[int]) -> None:
        import torch

        self.rows = rows
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.generator = None
        seed = rows[0].sampling.seed if len(rows) == 1 else None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)

    # -- logits processor ---------------------------------------------------

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        generated = input_ids.shape[1] - self.prompt_width
        scores = scores.float()
        chosen = torch.empty(len(self.rows), dtype=torch.long)
        for i, row in enumerate(self.rows):
            chosen[i] = self._choose(row, scores[i], generated)
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(len(self.rows)), chosen.to(scores.device)] = 0.0
        return out

    def _choose(self, row: _Row, logits: Any, generated: int) -> int:
        import torch

        s = row.sampling
        if row.done:
            return 0  # ignored; keeps the row's padding cheap
        if s.logit_bias:
            ids = torch.tensor([t for t, _ in s.logit_bias], device=logits.device)
            logits[ids] += torch.tensor([b for _, b in s.logit_bias], device=logits.device)
        if generated < s.min_tokens:
            banned = [t for t in (*self.eos_ids, *s.stop_token_ids) if t < logits.shape[0]]
            logits[banned] = float("-inf")
        if s.temperature <= 0.0:
            return int(torch.argmax(logits))
        logits = logits / s.temperature
        probs = torch.softmax(logits, dim=-1)
        if s.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > s.top_p
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    # -- stopping criterion -------------------------------------------------

    def stopping(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        new_tokens = input_ids[:, -1].tolist()
        done = []
        for row, token in zip(self.rows, new_tokens, strict=True):
            if not row.done:
                self._advance(row, int(token))
            done.append(row.done)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _advance(self, row: _Row, token: int) -> None:
        if row.aborted.is_set():
            row.done = True
            return
        s = row.sampling
        decoder = row.decoder
        decoder.add(token)
        count = len(decoder.tokens)
        finish: str | None = None
        stops = (token in self.eos_ids and not s.ignore_eos) or token in s.stop_token_ids
        if stops and count >= s.min_tokens:
            finish = "stop"
        if finish is None and count >= row.max_tokens:
            finish = "length"
        if finish is not None:
            decoder.flush()
        end = len(decoder.text)
        if s.stop and count >= s.min_tokens:
            hit = _find_stop(decoder.text, s.stop, max(0, row.sent - _longest(s.stop)))
            if hit is not None:
                end, finish = hit, "stop"
        if finish is None and s.stop:
            # Hold back what could still become a stop string.
            end = max(row.sent, end - (_longest(s.stop) - 1))
        text = decoder.text[row.sent : end]
        row.sent = end
        if finish is not None:
            row.done = True
        if text or finish is not None:
            row.send(
                TextDelta(
                    text=text,
                    completion_tokens=count,
                    prompt_tokens=len(row.prompt_ids),
                    finish_reason=finish,
                )
            )


def _longest(stop: tuple[str, ...]) -> int:
    return max(len(s) for s in stop)


def _find_stop(text: str, stop: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


@dataclass(frozen=True)
class TransformersOptions:
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_window_s: float = DEFAULT_BATCH_WINDOW_S


class TransformersTextEngine:
    kind = ModelKind.CHAT
    replays_token_ids = False

    def __init__(self, name: str, model_path: Path, options: EngineOptions) -> None:
        self._name = name
        self._model_path = model_path
        self._options = options
        own = engine_options(TransformersOptions, options.extra, "transformers")
        refuse_settings(options, "transformers", PORTABLE_SETTINGS)
        self._max_batch_size = own.max_batch_size
        self._batch_window_s = own.batch_window_s
        self._model: Any = None
        self._tokenizer: Any = None
        self._renderer: ChatPromptRenderer | None = None
        self._eos_ids: set[int] = set()
        self._pad_id = 0
        self._info: TextModelInfo | None = None
        self._rows: queue.Queue[_Row | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: set[_Row] = set()  # queued, not yet in a batch
        self._batch: list[_Row] = []  # the batch being generated
        self._active_ids: set[str] = set()
        self._stopping = False
        self.batch_sizes: deque[int] = deque(maxlen=1000)  # rows per generate call

    @property
    def info(self) -> TextModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    async def start(self) -> None:
        loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()

        def report(exc: BaseException | None) -> None:
            if not loaded.done():
                if exc is None:
                    loaded.set_result(None)
                else:
                    loaded.set_exception(exc)

        self._worker = threading.Thread(
            target=self._work,
            args=(lambda exc: loop.call_soon_threadsafe(report, exc),),
            name=f"transformers-{self._name}",
            daemon=True,
        )
        self._worker.start()
        await loaded

    # -- requests -----------------------------------------------------------

    async def generate(self, request: TextRequest) -> AsyncIterator[TextDelta]:
        if self._info is None or self._renderer is None or self._stopping:
            raise ServiceUnavailable("The model is not loaded.", code="model_loading")
        refuse_tools_and_logprobs(request, "transformers")
        tools = json.loads(request.tools.tools_json) if request.tools is not None else None
        prompt_ids, produced = resume.prompt_ids(self._renderer.render, request, tools)
        request = resume.rebased(request, produced)
        max_tokens = self._validate(request.sampling, len(prompt_ids))
        if request.request_id in self._active_ids:
            raise Conflict(
                f"A request with id {request.request_id!r} is already running.",
                param="request_id",
                code="duplicate_request_id",
            )
        row = _Row(
            request,
            prompt_ids,
            max_tokens,
            asyncio.get_running_loop(),
            IncrementalDecoder(self._tokenizer),
        )
        self._active_ids.add(request.request_id)
        with self._lock:
            self._pending.add(row)
        self._rows.put(row)
        finished = False
        try:
            while True:
                item = await row.deltas.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finish_reason is not None
                yield resume.count(item, produced)
                if finished:
                    return
        finally:
            self._active_ids.discard(request.request_id)
            if not finished:
                row.aborted.set()
                with self._lock:
                    self._pending.discard(row)

    def _validate(self, s: SamplingOptions, prompt_len: int) -> int:
        info = self.info
        check_prompt_fits(prompt_len, s.max_tokens, info.context_length)
        check_token_ids(s.stop_token_ids, s.logit_bias, info.vocab_size)
        if s.json_schema is not None or s.regex is not None or s.json_object:
            raise BadRequest(
                "Structured output (response_format json_schema/json_object, regex) is not "
                "supported by the transformers engine: it has no grammar-constrained decoding. "
                "Serve this model with vLLM for structured output.",
                param="response_format",
                code="unsupported_parameter",
            )
        if s.max_tokens is not None and s.max_tokens < 1:
            raise BadRequest("'max_tokens' must be at least 1.", param="max_tokens")
        if s.temperature < 0:
            raise BadRequest("'temperature' must be at least 0.", param="temperature")
        if not 0.0 < s.top_p <= 1.0:
            raise BadRequest("'top_p' must be in (0, 1].", param="top_p")
        if s.min_tokens < 0:
            raise BadRequest("'min_tokens' must be at least 0.", param="min_tokens")
        budget = info.context_length - prompt_len
        return budget if s.max_tokens is None else s.max_tokens

    def load(self) -> EngineLoad:
        with self._lock:
            running = sum(1 for r in self._batch if not r.done and not r.aborted.is_set())
            return EngineLoad(running=running, waiting=len(self._pending))

    async def check_health(self) -> None:
        if self._model is None:
            raise RuntimeError("engine not started")
        if self._worker is None or not self._worker.is_alive():
            raise RuntimeError("the transformers worker thread has stopped")

    async def shutdown(self) -> None:
        self._stopping = True
        if self._worker is not None and self._worker.is_alive():
            self._rows.put(None)
            await asyncio.to_thread(self._worker.join)
        self._worker = None

    # -- the worker thread --------------------------------------------------

    def _work(self, report: Any) -> None:
        try:
            self._load()
        except BaseException as exc:
            report(exc)
            return
        report(None)
        held: deque[_Row] = deque()  # seeded rows wait here to run alone
        while True:
            first = held.popleft() if held else self._rows.get()
            if first is None:
                break
            batch = [first]
            stop = False
            if first.sampling.seed is None:
                # Requests that arrive together (a burst reaching an idle
                # engine is rendered one by one on the event loop) share the
                # batch: wait a moment for each next one.
                deadline = time.monotonic() + self._batch_window_s * 4
                while len(batch) < self._max_batch_size:
                    wait = min(self._batch_window_s, deadline - time.monotonic())
                    try:
                        got = self._rows.get(timeout=wait) if wait > 0 else self._rows.get_nowait()
                    except queue.Empty:
                        break
                    if got is None:
                        stop = True
                        break
                    (held if got.sampling.seed is not None else batch).append(got)
            self._run(batch)
            if stop:
                break
        for row in itertools.chain(held, self._drain()):
            row.send(ServiceUnavailable("The replica is shutting down."))

    def _drain(self) -> list[_Row]:
        rows: list[_Row] = []
        while True:
            try:
                got = self._rows.get_nowait()
            except queue.Empty:
                return rows
            if got is not None:
                rows.append(got)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        device, dtype, spread = _placement(self._options)
        renderer = ChatPromptRenderer.from_pretrained(self._model_path)
        tokenizer = renderer.tokenizer
        model = AutoModelForCausalLM.from_pretrained(str(self._model_path), dtype=dtype, **spread)
        if not spread:
            model.to(device)
        model.eval()
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else min(self._eos_ids, default=0))
        # This engine does its own sampling and stopping: a neutral config,
        # so that nothing from the checkpoint (EOS, top_k, ...) applies twice.
        model.generation_config = GenerationConfig(
            pad_token_id=self._pad_id, eos_token_id=None, do_sample=False
        )
        config = model.config.get_text_config()
        context = int(getattr(config, "max_position_embeddings", 0) or 2048)
        if self._options.context_limit is not None:
            context = min(context, self._options.context_limit)
        self._model, self._tokenizer, self._renderer = model, tokenizer, renderer
        self._info = TextModelInfo(
            name=self._name, context_length=context, vocab_size=int(config.vocab_size)
        )
        torch.set_grad_enabled(False)
        logger.info("loaded %s on %s (%s): %s", self._model_path, device, dtype, self._info)

    def _run(self, batch: list[_Row]) -> None:
        with self._lock:
            live = [r for r in batch if not r.aborted.is_set()]
            self._pending.difference_update(batch)
            self._batch = live
        if not live:
            return
        self.batch_sizes.append(len(live))
        try:
            self._generate(live)
        except Exception as exc:
            logger.exception("generation failed for a batch of %d", len(live))
            for row in live:
                if not row.done:
                    row.done = True
                    row.send(exc)
        finally:
            with self._lock:
                self._batch = []

    def _generate(self, rows: list[_Row]) -> None:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        width = max(len(r.prompt_ids) for r in rows)
        device = self._model.device
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(row.prompt_ids)
            attention[i, width - n :] = 1
        hooks = _Batch(rows, width, self._eos_ids)
        with torch.inference_mode():
            self._model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=max(r.max_tokens for r in rows),
                logits_processor=LogitsProcessorList([hooks]),
                stopping_criteria=StoppingCriteriaList([hooks.stopping]),
            )
        for row in rows:
            if not row.done:  # the context ran out before the row's own limit
                row.done = True
                row.decoder.flush()
                row.send(
                    TextDelta(
                        text=row.decoder.text[row.sent :],
                        completion_tokens=len(row.decoder.tokens),
                        prompt_tokens=len(row.prompt_ids),
                        finish_reason="length",
                    )
                )


def _placement(options: EngineOptions) -> tuple[str, Any, dict[str, Any]]:
    """(device, dtype, from_pretrained arguments spreading the model over
    several GPUs) for these options."""
    import torch

    cuda = torch.cuda.is_available() and options.device in ("auto", "cuda")
    if options.device == "cuda" and not cuda:
        raise RuntimeError("device 'cuda' was asked for, but torch sees no GPU")
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    wanted = options.weights_dtype
    if wanted == "auto":
        dtype = torch.bfloat16 if cuda else torch.float32
    elif wanted in dtypes:
        dtype = dtypes[wanted]
    else:
        raise ValueError(f"unknown dtype {wanted!r} for the transformers engine")
    if not cuda:
        return "cpu", dtype, {}
    if len(options.gpu_ids) > 1:
        # Layers spread over the replica's GPUs (pipeline style, one at a time).
        memory = {
            i: int(torch.cuda.get_device_properties(i).total_memory * 0.9) for i in options.gpu_ids
        }
        return f"cuda:{options.gpu_ids[0]}", dtype, {"device_map": "auto", "max_memory": memory}
    return (f"cuda:{options.gpu_ids[0]}" if options.gpu_ids else "cuda"), dtype, {}
