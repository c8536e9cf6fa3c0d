"""Time to first token is never below the prompt's own prefill time
(`perfmodel.loaded_step`): at any load the prompt still has to run through
the model once. Property-tested over the catalog's chat models and GPU
types, prompt lengths, concurrency and chunked prefill on and off."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferd.catalog import load_catalog
from inferd.catalog.fit import current
from inferd.catalog.perfmodel import loaded_step, precision_of, prefill_seconds
from inferd.catalog.workload import ChatWorkload, chat_performance, scheduler_limits

CATALOG = load_catalog()
CHAT = sorted(m.name for m in CATALOG.models.all() if m.kind == "chat")
GPUS = sorted(CATALOG.gpus.gpu_types)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(CHAT),
    gpu_name=st.sampled_from(GPUS),
    count=st.sampled_from((1, 2, 4, 8)),
    prompt=st.integers(1, 128_000),
    output=st.integers(1, 4096),
    concurrency=st.integers(1, 1024),
    chunked=st.booleans(),
)
def test_ttft_is_never_below_the_prompts_prefill_time(
    model: str, gpu_name: str, count: int, prompt: int, output: int, concurrency: int,
    chunked: bool,
) -> None:  # fmt: skip
    arch = CATALOG.models.get(model).chat
    gpu = CATALOG.gpus.gpu_type(gpu_name)
    params = current().parameters
    precision = precision_of(arch)
    budget = scheduler_limits(gpu).token_budget
    step = loaded_step(
        params, arch, precision, gpu, count, concurrency, prompt, output, budget, chunked
    )
    floor = prefill_seconds(params, arch, precision, gpu, count, prompt)
    assert step.ttft_s >= floor
    assert step.prefill_s >= floor
    # The recommender's own answer (p95 = a multiple of the mean) keeps the floor.
    perf = chat_performance(
        CATALOG.models.get(model), gpu, count, concurrency, ChatWorkload(1, prompt, output),
        chunked_prefill=chunked,
    )  # fmt: skip
    assert perf.ttft_p95_s is not None and perf.ttft_p95_s >= floor


def test_a_long_prompt_at_low_concurrency_waits_for_its_prefill() -> None:
    """The case the steady-state average got wrong: one 30,000-token prompt
    to a 70B model at a time. Its TTFT is its prefill (a compute-bound pass
    of about 2 x parameters x tokens FLOPs), not one average step."""
    model = CATALOG.models.get("llama-3.1-70b-instruct")
    gpu = CATALOG.gpus.gpu_type("H100-80GB")
    params = current().parameters
    arch = model.chat
    step = loaded_step(params, arch, precision_of(arch), gpu, 4, 1, 30_000, 200, 8192)
    flops = 2 * arch.parameters * 30_000
    peak = 4 * gpu.bf16_tflops * 1e12
    assert step.ttft_s > flops / peak  # slower than every GPU at its full peak
    assert step.ttft_s > 20 * step.step_s  # far more than one decode step
