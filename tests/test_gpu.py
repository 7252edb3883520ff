"""On one CUDA device: the cached step's dropout replay and the bf16 step (skipped without a GPU).

The CPU tests prove the cached step equal to the one-forward step; on CUDA two things differ:
dropout draws from the device's generator (``RngState`` must save and replay it per chunk), and
bf16 is accelerate's autocast with float32 weights. Each case runs in one process started as a
launcher starts a rank (an NCCL group of one, the DDP wrapper): the path of a multi-GPU run.
``launchers/gpu_proof.sh`` runs these (``pytest -m gpu``).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.gloo import run_as_launched

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _on_cpu(value):
    """Tensors moved to the host as numpy arrays, so that a rank's result survives its process."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def same_masks_on_the_device(step, batch: dict[str, dict[str, torch.Tensor]], loss_call: int):
    """tests/step_helpers.py's same_mask_reference on the step's device: the cached step's chunks
    encoded with gradient under the RNG states it seeds, and VaSCL's directions drawn from a
    generator on that device, as the step draws them (a CPU generator would draw others)."""
    from vascl_scale.lengths import restore_rows
    from vascl_scale.train.step import loss_call_seed

    device = step.accelerator.device
    torch.manual_seed(loss_call_seed(step.seed, loss_call, step.accelerator.process_index))  # CPU and CUDA
    generator = torch.Generator(device=device).manual_seed(loss_call_seed(step.seed, loss_call, 0))
    anchor = {k: v.to(device) for k, v in batch["anchor"].items()}  # single text: the anchor is both views
    spans = step.chunk_plan([anchor, anchor])
    pieces = [step.model(**step.chunk_inputs(anchor, rows)) for _, rows in spans]
    views = [
        restore_rows([p for (v, _), p in zip(spans, pieces) if v == view], [r for v, r in spans if v == view])
        for view in range(2)
    ]  # 2 x (b, d)
    out = step.objective(views, step.head, generator)
    step.accelerator.backward(out.loss)
    return out


def cuda_cached_and_reference(rank: int, world_size: int, dropout: float) -> list[dict]:
    """Per case of tests/test_cached_step.py, on the GPU: the cached loss call and the reference."""
    from tests.step_helpers import CASES, CHUNK, own_batch, parameter_gradients, step_parts

    results = []
    for objective, loss in CASES:
        calls = {}
        for mode in ("same_masks", "cached"):
            _, model, step, recorder = step_parts(objective, loss, CHUNK, dropout)
            forwards: list[tuple[bool, torch.Tensor]] = []
            model.register_forward_hook(
                lambda module, args, output, seen=forwards: seen.append(
                    (torch.is_grad_enabled(), output.detach().clone())
                )
            )
            batch = own_batch(rank, world_size)
            out = step.cached_loss_call(batch, 0, 0) if mode == "cached" else same_masks_on_the_device(step, batch, 0)
            calls[mode] = {
                "loss": out.loss.detach(),
                "gradients": parameter_gradients(model),
                "recorded": recorder.calls,
                "forwards": forwards,
            }
        calls["devices"] = sorted({str(t.device) for _, t in calls["cached"]["forwards"]})
        results.append(calls)
    return _on_cpu(results)


def test_on_cuda_the_cached_call_replays_each_chunks_dropout_masks() -> None:
    from tests.step_helpers import CASE_IDS, assert_same_call

    (results,) = run_as_launched(cuda_cached_and_reference, 1, 0.2)
    for case_id, result in zip(CASE_IDS, results):
        assert result["devices"] == ["cuda:0"], case_id
        reference, cached = result["same_masks"], result["cached"]
        assert_same_call(cached, reference, f"{case_id}, CUDA, dropout 0.2")
        forwards = cached["forwards"]  # 2 views x 3 chunks without gradient, then again with it
        assert [grad for grad, _ in forwards] == [False] * 6 + [True] * 6
        for index in range(6):
            torch.testing.assert_close(
                torch.as_tensor(forwards[6 + index][1]), torch.as_tensor(forwards[index][1]), rtol=1e-12, atol=1e-12
            )
        for index in range(3):  # the same sentences in both views, under different masks
            assert abs(forwards[index][1] - forwards[3 + index][1]).max() > 1e-3, (
                f"{case_id}: chunk {index}: the views share masks"
            )


def bf16_steps(rank: int, world_size: int) -> dict:
    """One optimiser step in bf16 per objective, uncached and cached, dropout off, from the
    same float32 weights: the losses, the weights' dtype and how far each step moved them."""
    from tests.step_helpers import own_batch
    from tests.tiny import tiny_encoder
    from vascl_scale.config import config_from_dict
    from vascl_scale.losses import build_objective
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    results = {}
    accelerator = None
    for objective in ("vascl", "simcse"):
        for chunk in (0, 3):
            config = config_from_dict({
                "objective": objective, "model": {"path": "tiny", "head_dim": 8}, "data": {"train": "fixed batches"},
                "loss": {"k": 3, "temperature": 0.1, "xi": 1.0, "eps": 1.0},
                "train": {"global_batch_size": 8, "precision": "bf16", "seed": 5, "chunk_size": chunk},
            })  # fmt: skip
            model = tiny_encoder(seed=0, dtype=torch.float32, head_dim=8)
            model.train()
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            accelerator = accelerator or build_accelerator(config, None, "bf16")  # one accelerator per process
            prepared, optimizer = prepare_for_training(
                accelerator, model, build_optimizer(model, config), config.train, 8
            )
            step = TrainingStep(
                accelerator, prepared, optimizer, build_objective(objective, config.loss.model_dump()), seed=5, per_device_batch=8,
                chunk_size=chunk, precision="bf16",
            )  # fmt: skip
            result = step(iter([own_batch(rank, world_size)]), 0)
            unwrapped = accelerator.unwrap_model(prepared)
            results[objective, chunk] = {
                "loss": float(result.terms["loss"]),
                "dtypes": sorted({str(p.dtype) for p in unwrapped.parameters()}),
                "moved": {
                    n: float((p.detach() - before[n].to(p.device)).abs().max()) for n, p in unwrapped.named_parameters()
                },
                "mixed_precision": str(accelerator.mixed_precision),
            }
    return results


def test_on_cuda_a_bf16_step_keeps_float32_weights_and_the_cached_step_matches() -> None:
    (results,) = run_as_launched(bf16_steps, 1)
    for objective in ("vascl", "simcse"):
        uncached, cached = results[objective, 0], results[objective, 3]
        for result in (uncached, cached):
            assert result["mixed_precision"] == "bf16"
            assert result["dtypes"] == ["torch.float32"], (
                objective
            )  # autocast computes in bf16, the weights stay float32
            assert math.isfinite(result["loss"]), objective
            moved = [n for n, v in result["moved"].items() if v > 0]
            assert len(moved) > len(result["moved"]) // 2, f"{objective}: the step hardly moved the weights"
        # bf16 rounds the two paths' products differently: equal to bf16's precision, not bit for bit.
        assert abs(cached["loss"] - uncached["loss"]) <= 2e-2 * max(1.0, abs(uncached["loss"])), objective
