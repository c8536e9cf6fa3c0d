"""GPU inventory: nvidia-smi parsing and matching devices to catalog types."""

from __future__ import annotations

import pytest

from inferd.catalog import load_catalog
from inferd.control.launchers.inventory import LocalGpu, match_gpu_type, parse_nvidia_smi

SMI = """0, NVIDIA H100 80GB HBM3, 81559
1, NVIDIA H100 80GB HBM3, 81559
2, NVIDIA L40S, 46068
3, NVIDIA L4, 23034
4, NVIDIA A100-SXM4-40GB, 40960
5, NVIDIA A100-SXM4-80GB, 81920
6, NVIDIA H200, 143771
7, NVIDIA A10G, 23028
8, Some Future GPU, 99999
"""


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(SMI + "garbage line\n")
    assert len(gpus) == 9
    assert gpus[0] == LocalGpu(0, "NVIDIA H100 80GB HBM3", 81559)


@pytest.mark.parametrize(
    "index,expected",
    [(0, "H100-80GB"), (2, "L40S"), (3, "L4"), (4, "A100-40GB"), (5, "A100-80GB"), (6, "H200"),
     (7, "A10G"), (8, None)],
)  # fmt: skip
def test_devices_match_catalog_types(index: int, expected: str | None) -> None:
    gpu_types = load_catalog().gpus.gpu_types
    assert match_gpu_type(parse_nvidia_smi(SMI)[index], gpu_types) == expected
