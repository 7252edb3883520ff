"""The dense bf16 peaks behind MFU when no --peak-tflops is given: known names, known answers."""

from __future__ import annotations

import pytest

from vascl_scale.bench.peaks import known_peak, resolve_peak


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
    ],
)
def test_known_gpus_get_their_data_sheet_dense_bf16_peak(name: str, tflops: float) -> None:
    assert known_peak(name)[0] == tflops


def test_gpus_without_an_entry_or_without_bf16_get_no_peak_and_an_override_wins() -> None:
    assert known_peak("Tesla V100-SXM2-16GB") is None and known_peak("Tesla T4") is None
    assert resolve_peak("Tesla T4") == {"peak_tflops": 0.0, "source": "no entry for 'Tesla T4': MFU left out"}
    assert resolve_peak(None)["peak_tflops"] == 0.0
    assert resolve_peak("NVIDIA H200")["source"] == "data sheet, H200 SXM, dense bf16"
    assert resolve_peak("NVIDIA H200", "790") == {"peak_tflops": 790.0, "source": "PEAK_TFLOPS"}
    for bad in ("-1", "fast", "nan"):
        with pytest.raises(ValueError, match="PEAK_TFLOPS must be a number >= 0"):
            resolve_peak("NVIDIA H200", bad)
