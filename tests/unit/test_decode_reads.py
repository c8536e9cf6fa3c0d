"""What one decode step reads of the weights (`perfmodel.weight_read_bytes`):
every matrix it multiplies through, not the input embedding table, of which
it looks up only its tokens' rows. A tied table is the LM head's matrix and
is read in full."""

from __future__ import annotations

import pytest

from inferd.catalog import load_catalog
from inferd.catalog.fit import current
from inferd.catalog.models import ChatArchitecture
from inferd.catalog.perfmodel import Precision, step_time, weight_bytes, weight_read_bytes

CATALOG = load_catalog()


def _chat(name: str) -> ChatArchitecture:
    return CATALOG.models.get(name).chat


@pytest.mark.parametrize("weights", ["bf16", "fp8", "int4"])
def test_an_untied_input_embedding_table_is_not_read_by_a_step(weights: str) -> None:
    arch = _chat("llama-3.1-8b-instruct")
    assert not arch.tie_word_embeddings
    precision = Precision(weights)
    table = arch.vocab_size * arch.hidden_size * 2  # 16-bit under every weight format
    assert weight_read_bytes(arch, precision) == weight_bytes(arch, precision) - table


def test_a_tied_table_is_read_in_full_as_the_lm_head() -> None:
    tied = [m.chat for m in CATALOG.models.all() if m.kind == "chat" and m.chat.tie_word_embeddings]
    assert tied
    for arch in tied:
        assert weight_read_bytes(arch, Precision()) == weight_bytes(arch, Precision())


def test_a_memory_bound_decode_step_reads_the_weights_but_the_table() -> None:
    """One sequence, no context: the step's memory time is the read bytes
    at the fitted bandwidth, the table's share of the weights faster than a
    read of everything loaded."""
    arch = _chat("llama-3.1-8b-instruct")
    gpu = CATALOG.gpus.gpu_type("L4")
    params = current().parameters
    step = step_time(params, arch, Precision(), gpu, 1, 1, 0)
    rate = gpu.memory_bandwidth_gbps * 1e9 * params.per_generation("bandwidthEfficiency", "ada")
    assert step.bound == "memory-bandwidth"
    assert step.memory_s == pytest.approx(weight_read_bytes(arch, Precision()) / rate)
    assert step.memory_s < weight_bytes(arch, Precision()) / rate
