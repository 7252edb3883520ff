"""The FLOP count behind TFLOP/s and MFU: known answers."""

from __future__ import annotations

import pytest
from transformers import BertConfig

from vascl_scale.flops import EncoderShape, head_forward_flops, tflops_and_mfu


def test_bert_base_forward_is_about_twice_its_parameters_per_token_plus_attention() -> None:
    shape = EncoderShape.of(BertConfig())  # 12 layers, d 768, f 3072
    assert shape == EncoderShape(12, 768, 3072)
    per_token = shape.forward_flops(1, 128) / 128
    weights = 12 * (4 * 768 * 768 + 2 * 768 * 3072)  # 85M parameters in the layers' matrices
    assert per_token == 2 * weights + 12 * 4 * 128 * 768  # plus attention's T^2 d terms
    assert shape.forward_flops(3, 128) == 3 * shape.forward_flops(1, 128)


def test_other_architectures_give_no_shape_and_the_head_and_mfu_formulas() -> None:
    class DistilBertLike:
        n_layers, dim, hidden_dim = 6, 768, 3072

    assert EncoderShape.of(DistilBertLike()) is None
    assert head_forward_flops(10, 4, 2) == 2 * 10 * (16 + 8)
    assert tflops_and_mfu(4e12, 2.0, 0.0) == (2.0, None)
    assert tflops_and_mfu(4e12, 2.0, 8.0) == (2.0, pytest.approx(0.25))
