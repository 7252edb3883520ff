"""Which floating-point precision a run computes in, on which device, and the autocast for it.

One resolution for training (``train.precision``) and evaluation (``eval --precision``):

- ``no``: float32 everywhere.
- ``bf16``: the encoder's matrix products under ``torch.autocast`` in bfloat16. Parameters, the
  optimiser state, the pooled embeddings (pooling sums in float32), logits and losses stay
  float32 (:func:`vascl_scale.losses.contrastive.full_precision`). On CUDA it needs a GPU with
  bf16; on a CPU it needs native bf16 arithmetic (AVX512-BF16 or AMX): without it autocast
  falls back to converting every operand, which made a training step 22x *slower* than float32
  on an AMD EPYC with AVX2 only (docs/speed.md), so it is refused rather than run.
- ``fp16``: CUDA only (loss scaling through accelerate).
- ``auto``: bf16 wherever it is native (a GPU with bf16, a CPU with AVX512-BF16 or AMX), else
  ``no``, for training and evaluation alike: both quality checks held (docs/speed.md: the
  CPU demo trained in bf16 matched float32 within 0.01 on every STS task, and bf16 evaluation
  of the packaged model within 0.01). Fidelity figures pass ``no`` explicitly.

``VASCL_SCALE_CPU_BF16=emulate`` lets bf16 run on a CPU without native support (slow; the
tests use it to check the code path on any machine); ``VASCL_SCALE_CPU_BF16=off`` treats a CPU
with native bf16 as one without (``auto`` is float32), so the suite's AVX2 path runs on any CPU.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

import torch

PRECISIONS = ("auto", "no", "bf16", "fp16")
EMULATE_ENV = "VASCL_SCALE_CPU_BF16"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX tiles), or :data:`EMULATE_ENV`
    asks to emulate it (``emulate``) or to leave it unused (``off``)."""
    setting = os.environ.get(EMULATE_ENV, "").lower()
    if setting not in ("", "emulate", "off"):
        raise ValueError(f"{EMULATE_ENV} must be emulate, off or unset; got {os.environ[EMULATE_ENV]!r}")
    if setting:
        return setting == "emulate"
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def local_device_type() -> str:
    """The device type runs use here by default: "cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def has_native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` ("cpu" or "cuda") computes in bf16 natively."""
    return torch.cuda.is_bf16_supported() if device_type == "cuda" else cpu_has_native_bf16()


def resolve_precision(requested: str, device_type: str, what: str) -> str:
    """``no``, ``bf16`` or ``fp16`` for ``requested`` on ``device_type`` ("cpu" or "cuda");
    ``what`` names the setting in errors (e.g. ``train.precision``)."""
    if requested not in PRECISIONS:
        raise ValueError(f"{what} must be one of {', '.join(PRECISIONS)}; got {requested!r}")
    cuda = device_type == "cuda"
    native_bf16 = has_native_bf16(device_type)
    if requested == "auto":
        return "bf16" if native_bf16 else "no"
    if requested == "fp16" and not cuda:
        raise ValueError(f"{what} = 'fp16' needs a CUDA device; use 'no' (or 'bf16' on a CPU with native bf16)")
    if requested == "bf16" and not native_bf16:
        where = "this GPU" if cuda else "this CPU (no AVX512-BF16 or AMX; emulated bf16 runs slower than float32)"
        raise ValueError(f"{what} = 'bf16' needs native bf16 arithmetic, which {where} lacks; use 'no' or 'auto'")
    return requested


def train_precision(requested: str) -> str:
    """``train.precision`` resolved for this machine's device."""
    return resolve_precision(requested, local_device_type(), "train.precision")


def precision_name(precision: str) -> str:
    """A resolved precision as logs and tables name it: "float32" for ``no``, else itself."""
    return "float32" if precision == "no" else precision


def precision_reason(requested: str, resolved: str, device_type: str, what: str) -> str:
    """What a run computes in and why, for its log: e.g. "bf16 (train.precision auto: this CPU
    has native bf16)" or "float32 (train.precision auto: this CPU lacks native bf16 ...)"."""
    name = precision_name(resolved)
    if requested != "auto":
        return f"{name} ({what} {requested})"
    device = "this GPU" if device_type == "cuda" else "this CPU"
    if resolved == "bf16":
        if device_type == "cpu" and os.environ.get(EMULATE_ENV, "").lower() == "emulate":
            return f"{name} ({what} auto: {EMULATE_ENV}=emulate asks for bf16 on any CPU, slowly)"
        return f"{name} ({what} auto: {device} computes bf16 natively)"
    if device_type == "cpu" and os.environ.get(EMULATE_ENV, "").lower() == "off":
        return f"{name} ({what} auto: {EMULATE_ENV}=off leaves bf16 unused on any CPU)"
    lacks = (
        "no bf16 support" if device_type == "cuda" else "no AVX512-BF16 or AMX: emulated bf16 runs slower than float32"
    )
    return f"{name} ({what} auto: {device} lacks native bf16, {lacks})"


def autocast(device_type: str, precision: str) -> AbstractContextManager:
    """The autocast context of a resolved ``precision`` (disabled for ``no``)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device_type=device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
