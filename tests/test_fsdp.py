"""FSDP2, the second sharded engine (vascl_scale.train.fsdp): its settings, its refusals, its
steps on real gloo ranks against DDP's, and its checkpoints' safety checks. The CLI runs
(stopped, resumed, exported, against DDP's runs) are in tests/test_train.py (its FSDP2 section)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gloo import run_as_launched
from tests.step_helpers import CHUNK, GLOBAL_BATCH, portable, step_parts
from tests.test_lengths import OBJECTIVE_CASES, _case_batch
from tests.train_helpers import REPO, plain_plan, write_config
from vascl_scale.config import FsdpConfig, load_config, load_fsdp_config

FULL_SHARD = REPO / "configs" / "fsdp" / "full-shard.yaml"
# Settings each step is run under, against DDP's step on the same ranks.
SETTINGS = {
    "full_shard": FsdpConfig(),
    "shard_grad_op": FsdpConfig(sharding_strategy="shard_grad_op"),
    "reduce every backward": FsdpConfig(gradient_sync="backward"),
    "cpu offload": FsdpConfig(cpu_offload=True),  # on a CPU the code path, not the memory it saves
}


def test_every_shipped_fsdp_file_loads_and_names_its_strategy() -> None:
    files = sorted((REPO / "configs" / "fsdp").glob("*.yaml"))
    assert [f.stem for f in files] == ["full-shard", "hybrid-shard", "shard-grad-op"]
    for path in files:
        assert load_fsdp_config(path).sharding_strategy == path.stem.replace("-", "_")


@pytest.mark.parametrize(
    "text, message",
    [
        ("sharding_strategy: zero3\n", "sharding_strategy must be one of 'full_shard', 'shard_grad_op', 'hybrid_shard'; got 'zero3'"),
        ("shard_size: 2\n", "shard_size = 2 sizes hybrid_shard's groups, and sharding_strategy is 'full_shard'"),
        ("offload: true\n", "unknown key offload; allowed keys in the config: cpu_offload, gradient_sync"),
        ("reduce_dtype: fp16\n", "reduce_dtype must be one of 'float32', 'bf16'; got 'fp16'"),
        ("- full_shard\n", "the top level must be a mapping of FSDP2 settings"),
    ],
)  # fmt: skip
def test_a_bad_fsdp_file_is_one_line_naming_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fsdp.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_fsdp_config(path)
    assert str(err.value).startswith(f"--fsdp {path}: ") and message in str(err.value), err.value
    with pytest.raises(ValueError, match="no such file"):
        load_fsdp_config(tmp_path / "missing.yaml")


def test_the_plan_refuses_two_engines_fp16_and_accelerates_own_fsdp(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vascl_scale.train.plan import make_plan

    config = load_config(write_config(workspace, tmp_path / "config.yaml"), [f"train.output_dir={tmp_path / 'run'}"])
    zero2 = REPO / "configs" / "deepspeed" / "zero2.json"
    with pytest.raises(ValueError, match=r"--fsdp .*full-shard.yaml and --deepspeed .*zero2.json name two engines"):
        make_plan(config, fsdp=FULL_SHARD, deepspeed=zero2, lock="workers")
    monkeypatch.setattr("vascl_scale.train.plan.train_precision", lambda setting: "fp16")  # as on a GPU
    with pytest.raises(ValueError, match="no loss scaling; set train.precision to bf16"):
        make_plan(config, fsdp=FULL_SHARD, lock="workers")
    monkeypatch.undo()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="pass --fsdp configs/fsdp/full-shard.yaml"):
        make_plan(config, lock="workers")


def test_the_plan_carries_the_settings_and_resolves_length_buckets_by_strategy(workspace: Path, tmp_path: Path) -> None:
    from vascl_scale.train.plan import RunPlan, make_plan

    config = load_config(write_config(workspace, tmp_path / "config.yaml"), [f"train.output_dir={tmp_path / 'run'}"])
    plan = make_plan(config, world_size=2, fsdp=FULL_SHARD, lock="workers")
    assert plan.engine == "fsdp" and plan.parameters_sharded and plan.fsdp == load_fsdp_config(FULL_SHARD)
    assert plan.length_buckets == 1  # full_shard gathers the parameters for every forward
    assert RunPlan.from_json(plan.to_json()).fsdp == plan.fsdp
    shard_grad_op = make_plan(config, fsdp=REPO / "configs" / "fsdp" / "shard-grad-op.yaml", lock="workers")
    assert shard_grad_op.length_buckets == 4  # gathered once per step: buckets cost no traffic
    assert plain_plan(config).engine == "ddp"


def test_hybrid_groups_must_divide_the_world() -> None:
    from vascl_scale.train.fsdp import mesh_shape

    hybrid = FsdpConfig(sharding_strategy="hybrid_shard")
    assert mesh_shape(hybrid, 16, 8) == (2, 8)  # one shard group per machine
    assert mesh_shape(FsdpConfig(sharding_strategy="hybrid_shard", shard_size=4), 16, 8) == (4, 4)
    assert mesh_shape(FsdpConfig(), 16, 8) == (1, 16)
    with pytest.raises(ValueError, match="shard groups of 3 ranks do not divide the 8 ranks"):
        mesh_shape(FsdpConfig(sharding_strategy="hybrid_shard", shard_size=3), 8, 8)


def test_an_unknown_block_class_names_the_classes_the_backbone_has() -> None:
    from tests.tiny import tiny_encoder
    from vascl_scale.train.fsdp import transformer_blocks

    encoder = tiny_encoder().encoder
    assert {type(m).__name__ for m in transformer_blocks(encoder, None)} == {"BertEmbeddings", "BertLayer"}
    with pytest.raises(ValueError, match="set transformer_layer_cls_to_wrap .* one of .*BertLayer"):
        transformer_blocks(encoder, ["LlamaDecoderLayer"])


def _full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (an FSDP2 shard gathered: every rank calls this in the same order)."""
    return {name: getattr(p, "full_tensor", lambda p=p: p)().detach().clone() for name, p in model.named_parameters()}


def fsdp_and_ddp_steps(
    rank: int,
    world_size: int,
    cases: list[str],
    settings: dict[str, FsdpConfig],
    max_grad_norm: float = 0.0,
    grad_accum_steps: int = 1,
) -> dict:
    """Per objective, uncached and cached: one optimiser step (SGD, dropout off, the gradients
    clipped to ``max_grad_norm`` if > 0, ``grad_accum_steps`` loss calls on the same rows) under
    DDP and under each of ``settings``: the loss, VaSCL's neighbours and perturbation, the
    parameters after it."""
    results = {}
    rows = GLOBAL_BATCH // world_size
    for case in cases:
        objective, loss, columns = OBJECTIVE_CASES[case]
        for mode, chunk_size in (("uncached", 0), ("cached", min(CHUNK, rows))):
            for engine, fsdp in {"ddp": None, **settings}.items():
                _, model, step, recorder = step_parts(
                    objective, loss, chunk_size, 0.0, grad_accum_steps=grad_accum_steps, sgd=True, fsdp=fsdp,
                    max_grad_norm=max_grad_norm,
                )  # fmt: skip
                result = step(iter([_case_batch(rank, world_size, columns)] * grad_accum_steps), 0)
                results[case, mode, engine] = {
                    "loss": result.terms["loss"],
                    "parameters": _full_parameters(model),
                    "recorded": recorder.calls,
                }
    return portable(results)


def _assert_same_steps(results: list[dict], engines: list[str]) -> None:
    for rank, by_key in enumerate(results):
        for (case, mode, engine), got in by_key.items():
            if engine == "ddp":
                continue
            reference, what = by_key[case, mode, "ddp"], f"{case}, {mode}, {engine}, rank {rank}"
            torch.testing.assert_close(got["loss"], reference["loss"], rtol=1e-12, atol=1e-12, msg=what)
            for ours, theirs in zip(got["recorded"], reference["recorded"], strict=True):
                assert (ours["neighbours"] == theirs["neighbours"]).all(), what
                torch.testing.assert_close(ours["delta"], theirs["delta"], rtol=1e-9, atol=1e-11, msg=what)
            initial = _initial_parameters(case)
            for name, value in reference["parameters"].items():
                # Every parameter the loss reaches moved (BERT's pooler is unused under mean pooling).
                moved = not torch.equal(torch.as_tensor(value), initial[name])
                assert moved != name.startswith("encoder.pooler."), f"{what}: {name} moved: {moved}"
                torch.testing.assert_close(
                    torch.as_tensor(got["parameters"][name]), torch.as_tensor(value), rtol=1e-9, atol=1e-11,
                    msg=lambda m, name=name: f"{what}, {name}: {m}",
                )  # fmt: skip
        assert {engine for *_, engine in by_key} == {"ddp", *engines}


def _initial_parameters(case: str) -> dict[str, torch.Tensor]:
    from tests.tiny import tiny_encoder
    from vascl_scale.losses.spec import objective_spec

    model = tiny_encoder(seed=0, head_dim=8, pair_classifier=objective_spec(OBJECTIVE_CASES[case][0]).classifier)
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.e2e
def test_fsdp2_steps_equal_ddp_steps_for_every_objective_on_2_ranks() -> None:
    results = run_as_launched(fsdp_and_ddp_steps, 2, list(OBJECTIVE_CASES), SETTINGS)
    _assert_same_steps(results, list(SETTINGS))


@pytest.mark.e2e
def test_fsdp2_and_hybrid_sharding_equal_ddp_on_4_ranks_with_clipping_and_accumulation() -> None:
    settings = {
        "full_shard": SETTINGS["full_shard"],
        "hybrid 2 x 2": FsdpConfig(sharding_strategy="hybrid_shard", shard_size=2),
    }
    # A norm far below the gradients': every step is clipped, the sharded backbone's and the whole
    # heads' gradients by one global norm (vascl_scale.train.fsdp.clip_grad_norm_). Two loss calls
    # per step: the first's backwards accumulate unsharded, the second's last reduces them.
    results = run_as_launched(fsdp_and_ddp_steps, 4, ["vascl"], settings, 1e-3, 2)
    _assert_same_steps(results, list(settings))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: DCP says so
def test_a_dcp_entry_that_is_no_plain_data_is_refused_before_dcp_unpickles_it(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from vascl_scale.train.checkpoint import verify_checkpoint_files

    # One process, no group: DCP writes the tensors raw and pickles the rest ("bytes" entries).
    plain, tampered = tmp_path / "plain" / "step-00000002", tmp_path / "tampered" / "step-00000002"
    dcp.save({"weight": torch.ones(3), "lr": 0.5}, checkpoint_id=str(plain / "fsdp"))
    verify_checkpoint_files(plain)  # plain data passes
    dcp.save(
        {"weight": torch.ones(3), "lr": Path("an object weights_only refuses")}, checkpoint_id=str(tampered / "fsdp")
    )
    checkpoint = tampered
    with pytest.raises(ValueError, match=r"__0_0.distcp: entry lr cannot be loaded safely \(UnpicklingError"):
        verify_checkpoint_files(checkpoint)


def bf16_compute_dtypes(rank: int, world_size: int) -> dict[str, str]:
    """One bf16 forward and backward of a tiny encoder sharded with train.precision bf16: the
    dtype of a block's weight inside its forward, of the stored shards and of their gradients."""
    import torch.distributed as dist

    from tests.tiny import tiny_encoder, token_batch
    from vascl_scale.train.fsdp import shard_model

    assert dist.is_initialized() and world_size == 2
    model = tiny_encoder(seed=0, dtype=torch.float32)
    shard_model(model, FsdpConfig(reduce_dtype="float32"), "bf16", torch.device("cpu"))
    seen = {}
    query = model.encoder.encoder.layer[0].attention.self.query

    def note_dtype(module, args) -> None:  # a pre-hook that returns nothing leaves the arguments alone
        seen.setdefault("compute", str(module.weight.dtype))

    query.register_forward_pre_hook(note_dtype)
    ids, mask = token_batch(4, 6, seed=rank)
    model(input_ids=ids, attention_mask=mask).float().pow(2).sum().backward()
    shard = query.weight
    return {**seen, "stored": str(shard.dtype), "gradient": str(shard.grad.dtype), "local": str(type(shard).__name__)}


def test_bf16_precision_computes_in_bf16_and_keeps_float32_shards_and_gradients() -> None:
    from tests.gloo import run_on_ranks

    for dtypes in run_on_ranks(bf16_compute_dtypes, 2):
        assert dtypes == {
            "compute": "torch.bfloat16",
            "stored": "torch.float32",
            "gradient": "torch.float32",
            "local": "DTensor",
        }


def compiled_and_eager_fsdp_steps(rank: int, world_size: int) -> dict:
    """VaSCL's cached step under FSDP2 full_shard, eager and with each block compiled (train.compile)."""
    from torch._inductor import config as inductor

    results = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        _, model, step, _ = step_parts("vascl", {}, CHUNK, 0.0, sgd=True, fsdp=FsdpConfig(), compile_blocks=compiled)
        with inductor.patch(fallback_random=True):
            result = step(iter([_case_batch(rank, world_size, {})]), 0)
        results[name] = {"loss": result.terms["loss"], "parameters": _full_parameters(model)}
    return portable(results)


@pytest.mark.slow
def test_fsdp2_with_compiled_blocks_equals_eager_fsdp2() -> None:
    for rank, results in enumerate(run_as_launched(compiled_and_eager_fsdp_steps, 2, timeout=900)):
        eager, compiled = results["eager"], results["compiled"]
        torch.testing.assert_close(compiled["loss"], eager["loss"], rtol=1e-9, atol=1e-11, msg=f"rank {rank}")
        for name, value in eager["parameters"].items():
            torch.testing.assert_close(
                compiled["parameters"][name], value, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{n}: {m}"
            )
