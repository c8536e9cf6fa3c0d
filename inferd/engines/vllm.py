"""Chat through vLLM's asynchronous engine (`AsyncLLM`), in this process.

The replica renders the chat template itself and hands vLLM token ids, so it
knows the prompt length before anything is queued: a prompt that does not fit
the context, or a `max_tokens` beyond it, is a 400 before the engine sees it.
vLLM's frontend still validates the rest (structured-output grammars, ...);
what it refuses is mapped to 400 here, never allowed to reach the engine core.

Abort: `generate` is an async generator; when the replica closes it (client
gone), the request is aborted in the engine at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inferd import procfs
from inferd.engines import resume, vllm_parsing
from inferd.engines.base import (
    AdapterRef,
    EngineLoad,
    EngineOptions,
    TextDelta,
    TextModelInfo,
    TextRequest,
    ToolCall,
    UnknownEngineOption,
)
from inferd.engines.chat_template import ChatPromptRenderer
from inferd.engines.interrupt import start_deaf_to_interrupt
from inferd.engines.limits import check_prompt_fits, check_token_ids
from inferd.engines.vllm_lora import VllmAdapters
from inferd.engines.vllm_serving import VllmServing
from inferd.engines.vllm_settings import vllm_args
from inferd.errors import BadRequest, Conflict, InferdError, ServiceUnavailable
from inferd.tracing import tracer
from inferd.vocab import ModelKind

logger = logging.getLogger(__name__)


class _LoadTracker:
    """Keeps the scheduler's latest counts; fed by vLLM's stat-logger hook."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        # Tokens the KV cache holds (blocks times block size), once known.
        self.kv_cache_tokens: int | None = None
        # Running totals: vLLM hands each interval's prefix-cache counts.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0


def _stat_logger_factory(tracker: _LoadTracker) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TrackingStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._cache = getattr(vllm_config, "cache_config", None)
            self.log_engine_initialized()

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                tracker.running = scheduler_stats.num_running_reqs
                tracker.waiting = scheduler_stats.num_waiting_reqs
                tracker.kv_cache_usage = scheduler_stats.kv_cache_usage
                prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
                if prefix is not None and not getattr(prefix, "reset", False):
                    tracker.prefix_cache_queries += prefix.queries
                    tracker.prefix_cache_hits += prefix.hits

        def log_engine_initialized(self) -> None:
            # The engine core sized its KV cache before the loggers start.
            blocks = getattr(self._cache, "num_gpu_blocks", None)
            block_size = getattr(self._cache, "block_size", None)
            if blocks and block_size:
                tracker.kv_cache_tokens = int(blocks) * int(block_size)

    return TrackingStatLogger


def engine_args_for(model_path: Path, name: str, options: EngineOptions) -> dict[str, Any]:
    """vLLM engine arguments for these options; shared with the benchmarks so
    that inferd and vLLM's own server run the very same engine configuration."""
    on_cpu = options.device == "cpu" or (options.device == "auto" and not _cuda_available())
    args: dict[str, Any] = {
        "model": str(model_path),
        "served_model_name": name,
        "dtype": options.dtype,
        "tensor_parallel_size": max(1, len(options.gpu_ids)),
        # Our own stat logger feeds load reports; vLLM's periodic log lines
        # are noise in a replica's log.
        "disable_log_stats": True,
    }
    if options.max_model_len is not None:
        args["max_model_len"] = options.max_model_len
    if options.serving.reasoning_parser:
        # Structured output starts after the reasoning, as with vLLM's
        # server started with --reasoning-parser.
        args["reasoning_parser"] = options.serving.reasoning_parser
    if on_cpu:
        # CUDA graphs do not exist on CPU, and torch.compile warm-up costs
        # more than it returns for the tiny models served here.
        args["enforce_eager"] = not options.optimize
    else:
        args["gpu_memory_utilization"] = options.gpu_memory_utilization
        args["enforce_eager"] = False
    args.update(vllm_engine_args(options.extra))
    # The endpoint's own settings last: the server's are its defaults.
    args.update(vllm_args(options.settings, options.draft_model_path))
    return args


def vllm_engine_args(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The vLLM engine's own options: any field of vLLM's `AsyncEngineArgs`,
    passed through as is; anything else is refused (a setting meant for
    another engine must not reach vLLM, which would fail deep in its start)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise UnknownEngineOption(
            f"the vllm engine takes no option {', '.join(map(repr, unknown))}; "
            "it takes the fields of vLLM's AsyncEngineArgs"
        )
    return dict(extra)


def import_vllm_serving_modules() -> None:
    """Import what starting an engine and its OpenAI serving code needs.
    Call it in a thread (`asyncio.to_thread`): the first import of vLLM takes
    seconds to tens of seconds on a busy CPU, and on the event loop it would
    stop the replica's status reports, which the registry reads as a hung
    load."""
    import vllm.engine.arg_utils
    import vllm.entrypoints.launchers.api_server.app_state
    import vllm.entrypoints.launchers.cli_args
    import vllm.v1.engine.async_llm  # noqa: F401


async def start_async_llm(
    engine_args: dict[str, Any], options: EngineOptions, tracker: _LoadTracker
) -> Any:
    """vLLM's AsyncLLM for `engine_args`, built off the event loop: importing
    vLLM and loading the model block for seconds to minutes, and the replica
    keeps answering /health and reporting "loading" meanwhile."""
    on_cpu = options.device == "cpu" or not _cuda_available()
    if on_cpu:
        # Read by vLLM's CPU worker (a child process) at start-up, in GiB.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.cpu_kv_cache_gib))
    await asyncio.to_thread(import_vllm_serving_modules)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # The engine core and its workers start here, deaf to a terminal's Ctrl-C:
    # the replica drains first, then stops them.
    engine = await asyncio.to_thread(
        start_deaf_to_interrupt,
        AsyncLLM.from_engine_args,
        AsyncEngineArgs(**engine_args, **vllm_tracing_args()),
        stat_loggers=[_stat_logger_factory(tracker)],
    )
    if on_cpu:
        keep_engine_core_with_its_workers(engine)
    return engine


def vllm_tracing_args() -> dict[str, Any]:
    """vLLM's own request spans go where the replica's go, as children of
    the replica's span (the trace context it passes with each request)."""
    settings = tracer().settings
    url = settings.traces_url()
    if url is None:
        return {}
    # vLLM picks its exporter from OpenTelemetry's variable (gRPC by default).
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = settings.protocol
    return {"otlp_traces_endpoint": url}


def keep_engine_core_with_its_workers(engine: Any) -> None:
    """On a CPU, run vLLM's engine-core process on the cores of its workers.

    vLLM binds each CPU worker to its own cores and leaves the rest for the
    front end, but the engine core floats. While a worker computes a step
    the engine core spins on `sched_yield()` waiting for it, and on a
    machine with few cores (measured on 2 vCPUs, kernel 6.18) that spin,
    sharing the front end's core, left other processes there without CPU
    for as long as generation lasted: the replica delivered a 1,800-token
    stream in one burst after 2 s, a 7,000-token one after 10 s, and
    /health, the control plane and clients sharing the core stalled as
    long; vLLM's own OpenAI server does the same. On its worker's cores the
    spin only takes turns with the worker, which waits for it anyway: 24
    streams in a row arrived with no gap above 40 ms, and a process sleeping
    5 ms beside them never woke more than 9 ms late."""
    for core in _engine_core_pids(engine):
        pin_to_its_workers(core)


def pin_to_its_workers(core: int) -> set[int]:
    """Move every thread of the engine-core process `core` onto the CPUs its
    worker processes are bound to; returns them (empty: nothing was moved,
    the workers being bound to no subset of what the core may use)."""
    cpus: set[int] = set()
    for worker in procfs.children(core):
        try:
            cpus |= os.sched_getaffinity(worker)
        except OSError:
            continue
    try:
        allowed = os.sched_getaffinity(core)
    except OSError:
        return set()
    if not cpus or cpus >= allowed:
        return set()
    for tid in procfs.threads(core):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError as exc:  # gone, or not ours to change: serve anyway
            logger.info("could not move engine-core thread %d: %s", tid, exc)
    logger.info("vLLM engine core %d runs on its workers' CPUs %s", core, sorted(cpus))
    return cpus


def _engine_core_pids(engine: Any) -> list[int]:
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    processes = getattr(getattr(resources, "engine_manager", None), "processes", None) or []
    return [p.pid for p in processes if p.pid is not None]


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class AsyncLLMEngine:
    """What every engine over vLLM's `AsyncLLM` in this process shares: the
    engine's lifetime (a subclass starts it; health and shutdown here), the
    scheduler's counts, and vLLM's own serving objects over it."""

    def __init__(self, name: str, model_path: Path, options: EngineOptions) -> None:
        self._name = name
        self._model_path = model_path
        self._options = options
        vllm_engine_args(options.extra)  # refuse unknown options now, not at start
        self._engine: Any = None
        self._openai: VllmServing | None = None
        self._tracker = _LoadTracker()

    @property
    def openai_serving(self) -> VllmServing | None:
        """vLLM's own serving objects over this engine (completions,
        embeddings, ...); None until the engine has loaded."""
        return self._openai

    def _scheduled(self) -> tuple[int, int]:
        """(running, waiting). The frontend's own count covers requests not
        yet seen by the scheduler; the stat logger gives the scheduler's split."""
        unfinished = self._engine.get_num_unfinished_requests() if self._engine else 0
        running = min(unfinished, self._tracker.running) if unfinished else 0
        return running, max(0, unfinished - running)

    async def check_health(self) -> None:
        if self._engine is None:
            raise RuntimeError("engine not started")
        await self._engine.check_health()

    async def shutdown(self) -> None:
        self._openai = None
        if self._engine is not None:
            engine, self._engine = self._engine, None
            # vLLM's shutdown stops the engine core first and its output
            # handler (a task on this loop) last; run in a thread, that
            # leaves the handler reading from a dead core, which it logs as
            # an EngineDeadError traceback on every clean stop. Nothing is
            # in flight by now (the replica drained): end the handler first.
            handler = getattr(engine, "output_handler", None)
            if isinstance(handler, asyncio.Task) and not handler.done():
                handler.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await handler
            await asyncio.to_thread(engine.shutdown)


class VllmTextEngine(AsyncLLMEngine):
    kind = ModelKind.CHAT
    # Resumes an answer from its token ids (`TextRequest.resume`).
    replays_token_ids = True

    def __init__(self, name: str, model_path: Path, options: EngineOptions) -> None:
        super().__init__(name, model_path, options)
        self._renderer: ChatPromptRenderer | None = None
        self._info: TextModelInfo | None = None
        self._active: set[str] = set()
        self._parser_cls: Any = None
        # None: the engine runs without LoRA (engineSettings.maxLoras unset).
        self._adapters: VllmAdapters | None = None

    @property
    def info(self) -> TextModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    async def start(self) -> None:
        args = engine_args_for(self._model_path, self._name, self._options)
        self._engine = await start_async_llm(args, self._options, self._tracker)
        model_config = self._engine.model_config
        self._renderer = ChatPromptRenderer.from_pretrained(self._model_path)
        self._parser_cls = vllm_parsing.parser_class(
            self._options.serving.tool_call_parser,
            self._options.serving.reasoning_parser,
            self._name,
            self._renderer.tokenizer,
        )
        self._info = TextModelInfo(
            name=self._name,
            context_length=int(model_config.max_model_len),
            vocab_size=int(model_config.get_vocab_size()),
        )
        serving = self._options.serving
        self._openai = await VllmServing.build(
            self._engine,
            self._model_path,
            [self._name],
            tool_call_parser=serving.tool_call_parser,
            reasoning_parser=serving.reasoning_parser,
        )
        if self._options.settings.maxLoras:
            self._adapters = VllmAdapters(self._engine, self._openai.models)

    async def load_adapter(self, adapter: AdapterRef) -> None:
        await self._lora_request(adapter)

    async def _lora_request(self, adapter: AdapterRef | None) -> Any:
        if adapter is None:
            return None
        if self._adapters is None:
            raise BadRequest(
                f"The model '{adapter.name}' is a LoRA adapter, and this replica runs without "
                "LoRA (engineSettings.maxLoras is not set).",
                param="model",
                code="lora_disabled",
            )
        return await self._adapters.request_for(adapter)

    def count_tokens(self, text: str) -> int:
        """The prompt tokens `text` makes on /v1/completions (special tokens
        added, as vLLM's server adds them)."""
        if self._renderer is None:
            raise ServiceUnavailable("The model is still loading.", code="model_loading")
        return len(self._renderer.tokenizer(text).input_ids)

    async def generate(self, request: TextRequest) -> AsyncIterator[TextDelta]:
        if self._engine is None or self._renderer is None:
            raise ServiceUnavailable("The model is still loading.", code="model_loading")
        parsing = vllm_parsing.request_parsing(
            request,
            self._parser_cls,
            self._renderer.tokenizer,
            self._engine.model_config,
            self._name,
        )
        # Offered tools are in the prompt even with tool_choice "none", as in
        # vLLM's server: the model knows them, it is only not asked to call.
        tools = json.loads(request.tools.tools_json) if request.tools is not None else None
        replay = None
        if request.resume is not None:
            replay = self._replay(request, tools, parsing)
            if replay is None:
                request = resume.as_text(request)
        regenerated = 0
        if replay is not None:
            prompt_ids, produced, unread = replay
            assert request.resume is not None
            regenerated = len(request.resume.token_ids) - produced
        else:
            prompt_ids, produced = resume.prompt_ids(self._renderer.render, request, tools)
            unread = ""
        request = resume.rebased(request, produced)
        params = self._sampling_params(request, len(prompt_ids), parsing)
        lora = await self._lora_request(request.adapter)
        if request.request_id in self._active:
            raise Conflict(
                f"A request with id {request.request_id!r} is already running.",
                param="request_id",
                code="duplicate_request_id",
            )
        self._active.add(request.request_id)
        extra = parsing.reasoning_kwargs(prompt_ids) if parsing is not None else {}
        stream = self._engine.generate(
            {"prompt_token_ids": prompt_ids},
            params,
            request.request_id,
            lora_request=lora,
            trace_headers=dict(request.trace_headers) or None,
            **extra,
        )
        mapped = _map_vllm_errors(stream)
        finished = False
        try:
            if parsing is None:
                deltas = self._plain(mapped, len(prompt_ids))
            else:
                deltas = self._parsed(mapped, prompt_ids, request, parsing)
            if unread or regenerated:
                deltas = resume.first_text(deltas, unread, regenerated)
            if produced:
                deltas = resume.counted(deltas, produced)
            async for delta in deltas:
                finished = delta.finish_reason is not None
                yield delta
        finally:
            self._active.discard(request.request_id)
            # Closing vLLM's generator aborts the request in the engine; do it
            # now rather than whenever the generator is garbage-collected.
            await mapped.aclose()
            await stream.aclose()
            if not finished and not self._engine.errored:
                await self._engine.abort(request.request_id)

    def _replay(
        self,
        request: TextRequest,
        tools: list[dict[str, Any]] | None,
        parsing: vllm_parsing.RequestParsing | None,
    ) -> tuple[list[int], int, str] | None:
        """(prompt ids: the original request's followed by the answer's so
        far, how many of them are the answer's, the text of them the client
        has not read) of a request resumed by token ids; None when the
        replay would not be exact (`resume.unread`): it goes on from the
        text instead."""
        assert request.resume is not None and self._renderer is not None
        base = self._renderer.render(
            request.messages,
            tools,
            continue_final=request.continue_final,
            generation_prompt=request.generation_prompt,
        )
        ids = list(request.resume.token_ids)
        vocab = self.info.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise BadRequest("The resumed answer's token ids are outside the vocabulary.")
        skip_special = parsing.skip_special_tokens if parsing is not None else True
        # The engine's own tokenizer: the one its output processor decodes with.
        tokenizer = self._engine.tokenizer
        # Tokens that end in part of a character are generated again: their
        # text was held back (the client has none of it), and vLLM's decoder
        # primed with a prompt that ends inside a character emits the whole
        # prompt's text with the character's end.
        ids = ids[: whole_characters(tokenizer, ids)]
        decoded = decoded_text(tokenizer, base, ids, skip_special)
        unread = resume.unread(
            decoded, request.resume.text, request.sampling.stop, parsing is not None
        )
        if unread is None:
            logger.info(
                "request %s: resumed from its text, not its token ids (their text does not "
                "continue exactly from what the client read)",
                request.request_id,
            )
            return None
        return base + ids, len(ids), unread

    async def _plain(
        self, outputs: AsyncIterator[Any], prompt_tokens: int
    ) -> AsyncIterator[TextDelta]:
        completion_tokens = 0
        async for output in outputs:
            completion = output.outputs[0]
            completion_tokens += len(completion.token_ids)
            yield TextDelta(
                text=completion.text,
                completion_tokens=completion_tokens,
                prompt_tokens=prompt_tokens,
                finish_reason=_finish_reason(completion.finish_reason) if output.finished else None,
                token_ids=tuple(completion.token_ids),
            )

    async def _parsed(
        self,
        outputs: AsyncIterator[Any],
        prompt_ids: list[int],
        request: TextRequest,
        parsing: vllm_parsing.RequestParsing,
    ) -> AsyncIterator[TextDelta]:
        """Deltas through vLLM's parsers: per delta when streaming; once, over
        the whole output, when the client reads the answer whole (vLLM's
        server parses the two ways, and a few parsers differ between them)."""
        completion_tokens = 0
        called_tools = False
        text_parts: list[str] = []
        token_ids: list[int] = []
        top = request.logprobs or 0
        tokenizer = self._renderer.tokenizer if self._renderer is not None else None
        async for output in outputs:
            completion = output.outputs[0]
            completion_tokens += len(completion.token_ids)
            logprobs = (
                vllm_parsing.token_logprobs(
                    completion.token_ids, completion.logprobs, top, tokenizer
                )
                if request.logprobs is not None
                else ()
            )
            finish = _finish_reason(completion.finish_reason) if output.finished else None
            tool_calls: tuple[ToolCall, ...] = ()
            if request.stream:
                content, reasoning, tool_calls = parsing.delta(
                    completion.text, completion.token_ids, prompt_ids, output.finished
                )
            else:
                text_parts.append(completion.text)
                token_ids.extend(completion.token_ids)
                content, reasoning = "", ""
                if output.finished:
                    content, reasoning, tool_calls = parsing.whole("".join(text_parts), token_ids)
            called_tools = called_tools or bool(tool_calls)
            if finish is not None:
                finish = parsing.finish_reason(finish, called_tools)
            yield TextDelta(
                text=content,
                completion_tokens=completion_tokens,
                prompt_tokens=len(prompt_ids),
                finish_reason=finish,
                reasoning=reasoning,
                tool_calls=tool_calls,
                logprobs=logprobs,
                token_ids=tuple(completion.token_ids),
            )

    def _sampling_params(
        self, request: TextRequest, prompt_len: int, parsing: vllm_parsing.RequestParsing | None
    ) -> Any:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        info = self.info
        s = request.sampling
        check_prompt_fits(prompt_len, s.max_tokens, info.context_length)
        check_token_ids(s.stop_token_ids, s.logit_bias, info.vocab_size)
        structured = None
        if s.json_schema is not None or s.regex is not None or s.json_object:
            structured = StructuredOutputsParams(
                json=s.json_schema, regex=s.regex, json_object=s.json_object or None
            )
        extra: dict[str, Any] = {}
        if parsing is not None:
            # vLLM's parser may have replaced the request's own constraint
            # with a forced or required tool call's.
            structured = parsing.structured_outputs()
            extra["skip_special_tokens"] = parsing.skip_special_tokens
        if request.logprobs is not None:
            limit = int(self._engine.model_config.max_logprobs)
            if request.logprobs > limit:
                raise BadRequest(
                    f"'top_logprobs' must be at most {limit} (vLLM's max_logprobs for this "
                    f"model), got {request.logprobs}.",
                    param="top_logprobs",
                    code="top_logprobs_over_limit",
                )
            extra["logprobs"] = request.logprobs
        try:
            return SamplingParams(
                max_tokens=s.max_tokens
                if s.max_tokens is not None
                else info.context_length - prompt_len,
                temperature=s.temperature,
                top_p=s.top_p,
                presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty,
                stop=list(s.stop) or None,
                seed=s.seed,
                ignore_eos=s.ignore_eos,
                min_tokens=s.min_tokens,
                stop_token_ids=list(s.stop_token_ids) or None,
                logit_bias=dict(s.logit_bias) or None,
                structured_outputs=structured,
                output_kind=RequestOutputKind.DELTA,
                **extra,
            )
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc)) from None
        except VLLMClientError as exc:
            # vLLM's own validation (VLLMValidationError, not a ValueError):
            # e.g. min_tokens above the room left in the context.
            raise BadRequest(str(exc), param=getattr(exc, "parameter", None)) from None

    def load(self) -> EngineLoad:
        running, waiting = self._scheduled()
        return EngineLoad(
            running=running,
            waiting=waiting,
            kv_cache_usage=self._tracker.kv_cache_usage,
            kv_cache_tokens=self._tracker.kv_cache_tokens,
            prefix_cache_queries=self._tracker.prefix_cache_queries,
            prefix_cache_hits=self._tracker.prefix_cache_hits,
            adapters=self._adapters.loaded if self._adapters is not None else (),
        )


def whole_characters(tokenizer: Any, ids: list[int]) -> int:
    """How many of `ids` there are up to the end of the last whole character
    they decode to (a UTF-8 character is at most 4 byte tokens); 0 if none."""
    for cut in range(len(ids), max(0, len(ids) - 4), -1):
        if not tokenizer.decode(ids[max(0, cut - 8) : cut]).endswith("\ufffd"):
            return cut
    return 0


def decoded_text(tokenizer: Any, prompt_ids: list[int], ids: list[int], skip_special: bool) -> str:
    """The text vLLM's incremental detokenizer makes of output token `ids`
    after `prompt_ids` (what the replica that produced them had decoded, none
    of it held back): vLLM's own detokenizer, fed as its output processor
    feeds it."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    params = SamplingParams(max_tokens=1, skip_special_tokens=skip_special)
    request = SimpleNamespace(
        request_id="resume", prompt_token_ids=prompt_ids, prompt_embeds=None, sampling_params=params
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    detokenizer.update(ids, False)
    return str(getattr(detokenizer, "output_text", ""))


def _finish_reason(reason: str | None) -> str:
    # vLLM says "stop" for EOS and stop strings, "length" at max_tokens,
    # "abort" when aborted.
    return reason if reason in ("stop", "length") else "stop"


async def _map_vllm_errors(stream: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    """Translate vLLM's exceptions into inferd's, so the replica answers 4xx
    for what the client got wrong and 503 when the engine itself is gone."""
    from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMNotFoundError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    try:
        async for item in stream:
            yield item
    except InferdError:
        raise
    except VLLMNotFoundError as exc:
        raise BadRequest(str(exc), code="not_found") from None
    except VLLMClientError as exc:
        raise BadRequest(str(exc), param=getattr(exc, "parameter", None)) from None
    except GracefulHTTPError as exc:
        raise ServiceUnavailable(str(exc), retry_after=1) from None
    except EngineDeadError as exc:
        # Nothing of this request was generated: the gateway may send it to
        # another replica; this one's health watch reports it failed.
        raise ServiceUnavailable(
            f"The engine of this replica has died: {exc}", code="engine_dead", retry_after=1
        ) from None
    except EngineGenerateError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValueError | TypeError | VLLMClientError | json.JSONDecodeError):
            raise BadRequest(str(cause)) from None
        raise
    except (ValueError, TypeError) as exc:
        raise BadRequest(str(exc)) from None
