"""Dense bf16 peak TFLOP/s of known GPUs: the denominator of MFU when none is given.

MFU (:func:`vascl_scale.flops.tflops_and_mfu`) divides the model FLOP/s a step achieved by the
device's peak in the run's precision. These are the vendors' data-sheet figures for dense bf16
tensor-core arithmetic (without structured sparsity, which doubles the advertised number) of
the form factor named; fp16 is the same on every part listed. A data-sheet peak is not what a
large matrix product reaches in practice (one H200 ran bf16 products at about 790 of its 989):
MFU against it is the conventional, conservative figure.

A name matching no entry has no peak (MFU left out, never guessed); GPUs without bf16 tensor
cores (V100, T4) are absent on purpose. ``PEAK_TFLOPS`` or ``--peak-tflops`` overrides the table.
"""

from __future__ import annotations

import re

# (pattern on the CUDA device name, dense bf16 TFLOP/s, the part it means). First match wins:
# the more specific forms (NVL, PCIe) come before the plain name that also matches them.
DENSE_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"\bGB200\b", 2500.0, "GB200 (per GPU)"),
    (r"\bB200\b", 2250.0, "B200 SXM"),
    (r"\bB100\b", 1750.0, "B100 SXM"),
    (r"\bGH200\b", 989.0, "GH200"),
    (r"\bH200\b.*\bNVL\b", 835.0, "H200 NVL"),
    (r"\bH200\b", 989.0, "H200 SXM"),
    (r"\bH100\b.*\bNVL\b", 835.0, "H100 NVL"),
    (r"\bH100\b.*\bPCIe\b", 756.0, "H100 PCIe"),
    (r"\bH100\b", 989.0, "H100 SXM"),
    (r"\bH800\b.*\bPCIe\b", 756.0, "H800 PCIe"),
    (r"\bH800\b", 989.0, "H800 SXM"),
    (r"\bH20\b", 148.0, "H20"),
    (r"\bA100\b", 312.0, "A100"),
    (r"\bA800\b", 312.0, "A800"),
    (r"\bA30\b", 165.0, "A30"),
    (r"\bA10\b", 125.0, "A10"),
    (r"\bL40S\b", 362.0, "L40S"),
    (r"\bL40\b", 181.0, "L40"),
    (r"\bL4\b", 121.0, "L4"),
)


def known_peak(device_name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s, the part matched) for a CUDA device name such as
    ``"NVIDIA H100 80GB HBM3"``; None when the table has no entry for it."""
    for pattern, tflops, part in DENSE_BF16_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return tflops, part
    return None


def resolve_peak(device_name: str | None, override: str | None = None) -> dict[str, object]:
    """The peak to use and where it came from: ``override`` (a ``PEAK_TFLOPS`` value, a number
    >= 0) first, else the table for ``device_name``, else 0 (no MFU).

    Returns ``{"peak_tflops": float, "source": str}``; an override that is not a number >= 0
    raises ``ValueError`` naming it.
    """
    if override is not None and override.strip():
        try:
            value = float(override)
        except ValueError:
            value = -1.0
        if not value >= 0:  # also refuses nan
            raise ValueError(f"PEAK_TFLOPS must be a number >= 0 (the device's dense TFLOP/s); got {override[:50]!r}")
        return {"peak_tflops": value, "source": "PEAK_TFLOPS"}
    found = known_peak(device_name) if device_name else None
    if found is None:
        return {
            "peak_tflops": 0.0,
            "source": f"no entry for {device_name!r}: MFU left out" if device_name else "no GPU: MFU left out",
        }
    return {"peak_tflops": found[0], "source": f"data sheet, {found[1]}, dense bf16"}
