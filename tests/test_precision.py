"""Precision resolution (train.precision, eval --precision) and its autocast."""

from __future__ import annotations

import pytest
import torch

from vascl_scale import precision
from vascl_scale.precision import EMULATE_ENV, autocast, resolve_precision, train_precision


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)


@pytest.fixture
def cpu_with_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)


def test_a_cpu_without_native_bf16_runs_float32_and_refuses_bf16_saying_what_to_use(cpu_without_bf16) -> None:
    assert resolve_precision("auto", "cpu", "train.precision", True) == "no"
    assert resolve_precision("no", "cpu", "train.precision", True) == "no"
    with pytest.raises(ValueError, match=r"train.precision = 'bf16' needs native bf16.*AVX512-BF16 or AMX.*use 'no'"):
        resolve_precision("bf16", "cpu", "train.precision", True)
    with pytest.raises(ValueError, match=r"--precision = 'fp16' needs a CUDA device"):
        resolve_precision("fp16", "cpu", "--precision", False)
    with pytest.raises(ValueError, match="must be one of auto, no, bf16, fp16; got 'fp8'"):
        resolve_precision("fp8", "cpu", "--precision", False)


def test_a_cpu_with_native_bf16_takes_bf16_and_auto_only_once_its_quality_check_held(cpu_with_bf16, monkeypatch) -> None:
    assert resolve_precision("bf16", "cpu", "train.precision", False) == "bf16"
    assert resolve_precision("auto", "cpu", "train.precision", True) == "bf16"
    assert resolve_precision("auto", "cpu", "--precision", False) == "no"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_precision("auto") == "no"  # the CPU demo in bf16 has not been checked yet
    monkeypatch.setattr(precision, "CPU_TRAINING_BF16_CHECKED", True)
    assert train_precision("auto") == "bf16"


def test_emulation_is_allowed_when_asked_for(cpu_without_bf16, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATE_ENV, "emulate")
    assert resolve_precision("bf16", "cpu", "train.precision", False) == "bf16"


def test_the_autocast_of_each_precision() -> None:
    with autocast("cpu", "no"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("cpu", "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
