"""Precision resolution (train.precision, eval --precision) and its autocast."""

from __future__ import annotations

import pytest
import torch

from vascl_scale import precision
from vascl_scale.precision import EMULATE_ENV, autocast, precision_reason, resolve_precision, train_precision


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)


def test_a_cpu_without_native_bf16_runs_float32_and_refuses_bf16_saying_what_to_use(cpu_without_bf16) -> None:
    assert resolve_precision("auto", "cpu", "train.precision") == "no"
    assert resolve_precision("no", "cpu", "train.precision") == "no"
    with pytest.raises(ValueError, match=r"train.precision = 'bf16' needs native bf16.*AVX512-BF16 or AMX.*use 'no'"):
        resolve_precision("bf16", "cpu", "train.precision")
    with pytest.raises(ValueError, match=r"--precision = 'fp16' needs a CUDA device"):
        resolve_precision("fp16", "cpu", "--precision")
    with pytest.raises(ValueError, match="must be one of auto, no, bf16, fp16; got 'fp8'"):
        resolve_precision("fp8", "cpu", "--precision")


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "no")])
def test_auto_trains_and_evaluates_in_bf16_exactly_where_the_cpu_has_it(
    monkeypatch, native: bool, expected: str
) -> None:
    # Detection mocked at the one function that asks torch.
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_precision("auto") == expected
    assert resolve_precision("auto", "cpu", "--precision") == expected
    assert train_precision("no") == "no"
    reason = precision_reason("auto", expected, "cpu", "train.precision")
    if native:
        assert reason == "bf16 (train.precision auto: this CPU computes bf16 natively)"
    else:
        assert reason.startswith("float32 (train.precision auto: this CPU lacks native bf16, no AVX512-BF16 or AMX")
    assert precision_reason("no", "no", "cpu", "train.precision") == "float32 (train.precision no)"


def test_emulation_is_allowed_when_asked_for(cpu_without_bf16, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATE_ENV, "emulate")
    assert resolve_precision("bf16", "cpu", "train.precision") == "bf16"


def test_native_bf16_can_be_left_unused_so_the_float32_path_runs_on_any_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``off``: a bf16 CPU runs ``auto`` as an AVX2 one does (the suite's other path, on one machine)."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setenv(EMULATE_ENV, "off")
    assert resolve_precision("auto", "cpu", "--precision") == "no"
    with pytest.raises(ValueError, match="needs native bf16 arithmetic"):
        resolve_precision("bf16", "cpu", "--precision")
    monkeypatch.setenv(EMULATE_ENV, "yes")
    with pytest.raises(ValueError, match=f"{EMULATE_ENV} must be emulate, off or unset; got 'yes'"):
        resolve_precision("auto", "cpu", "--precision")


def test_the_autocast_of_each_precision() -> None:
    with autocast("cpu", "no"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("cpu", "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
