"""Memory per device of LoRA training of a decoder embedder under DeepSpeed ZeRO-3 with the
cached step (``train.chunk_size``): pure arithmetic from the models' published shapes, no torch.
docs/batch-arithmetic.md prints its output.

    python -m tools.decoder_memory            # the tables of docs/batch-arithmetic.md (markdown)
    python -m tools.decoder_memory --measure  # A below, measured again, and the parameter counts
                                              # checked against transformers and peft (needs torch)

Every term is in bytes per device, for N devices, global batch B (b = B / N rows per view and
device), chunks of c rows of S tokens, v text columns (``simcse_sup`` on triplets: anchor,
positive, hard negative; 2 for ``vascl`` on sentences) and LoRA of rank r on every linear layer:

- frozen weights: the bf16 backbone sharded by ZeRO-3, ``2 P / N``;
- gathered: the largest module ZeRO-3 gathers whole for a forward or backward (one decoder layer,
  or the embedding matrix, which is larger in these models), ``2 x its parameters``; DeepSpeed's
  prefetch (``stage3_prefetch_bucket_size`` in configs/deepspeed/zero3.json) adds up to 100 MB;
- trainable: the LoRA matrices and the projection head with mixed-precision Adam, 16 bytes a
  parameter (bf16 weight and gradient, float32 master weight and two moments: Rajbhandari et al.
  2020, "ZeRO", section 3.1), sharded over N;
- activations of one chunk (the cached step holds no other): ``layers x A x c S h`` bytes, A the
  bytes a layer stores per token and hidden unit for its backward, measured (``--measure``: the
  tensors autograd saves in one bf16 forward of the model at 1/8 of its width, the same ratios of
  heads, KV heads and MLP to hidden, PyTorch's SDPA, peft's LoRA, per layer: the difference between
  3 layers and 1). Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", section 4.1) count ``34 + 5 a S / h`` for a GPT layer in 16-bit, 34 where
  FlashAttention stores no attention scores; these decoders store about 45 to 64 (RMSNorm computes
  in float32, SwiGLU MLPs of 3h to 5.8h, Qwen3's norms of q and k);
- LoRA dropout (``model.lora.dropout`` > 0): each adapted linear layer then keeps a dropped-out
  copy of its input and the mask, the measured difference ``A(0.1) - A(0)`` per token and hidden
  unit and layer (none with dropout 0, where peft uses the identity);
- with full activation checkpointing (``model.gradient_checkpointing``), Korthikanti's ``2 S c h``
  per layer (each layer's bf16 input) plus one layer's activations during its recomputation;
- cached embeddings: the whole per-device batch's pooled embeddings and their gradients,
  ``2 x b v h x 4`` bytes (float32);
- logits: ``b`` anchors against the ``(v - 1) B`` gathered candidates in float32, three times
  (logits, softmax, gradient), as the page's formula for VaSCL counts them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GIB = 2**30
DEVICES = 8
BATCHES = (2048, 16384)
CHUNK, LENGTH, RANK = 64, 512, 16
VIEWS = 3  # simcse_sup on (anchor, positive, hard negative)
HEAD_DIM = 128  # model.head_dim: the projection head d -> d -> 128
BUDGET_GIB = 70  # an 80 GB H100 less about 10 GiB: CUDA context, allocator, DeepSpeed's buckets
KORTHIKANTI = 34  # a GPT layer's activation bytes per token and hidden unit, 16-bit, FlashAttention
CHECKPOINTED = 2  # with full recomputation: each layer's bf16 input alone
NARROWER = 8  # --measure builds each model at 1/8 of its width (hidden, head_dim, MLP)


@dataclass(frozen=True)
class Decoder:
    """A decoder's shape as its config.json states it; the counts are of the base model that
    ``AutoModel`` loads (no LM head: an embedder does not use it). ``stored``: A, the bytes a
    layer stores for its backward per token and hidden unit, with LoRA dropout 0 and 0.1
    (``--measure``)."""

    name: str
    model_type: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    stored: tuple[float, float]
    qkv_bias: bool = False  # Qwen2's q, k and v projections have biases
    qk_norm: bool = False  # Qwen3's RMSNorm of each head's q and k

    def linears(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of each linear layer of one decoder layer: what
        peft's "all-linear" adapts (the LM head aside, which AutoModel does not load)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [
            ("q_proj", h, q),
            ("k_proj", h, kv),
            ("v_proj", h, kv),
            ("o_proj", q, h),
            ("gate_proj", h, i),
            ("up_proj", h, i),
            ("down_proj", i, h),
        ]

    def layer_parameters(self) -> int:
        weights = sum(n_in * n_out for _, n_in, n_out in self.linears())
        biases = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return weights + biases + norms

    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    def parameters(self) -> int:
        """The base model: embeddings, layers, final norm."""
        return self.embedding_parameters() + self.layers * self.layer_parameters() + self.hidden

    def lora_parameters(self, rank: int) -> int:
        """LoRA of rank r on every linear layer: A (r x in) and B (out x r) each."""
        return self.layers * sum(rank * (n_in + n_out) for _, n_in, n_out in self.linears())

    def head_parameters(self, head_dim: int = HEAD_DIM) -> int:
        """The projection head Linear(d, d) -> ReLU -> Linear(d, head_dim), no biases
        (vascl_scale.model.ProjectionHead), trained in full."""
        return self.hidden * self.hidden + self.hidden * head_dim


# Shapes from each model's config.json on the hub; ``stored`` from `python -m tools.decoder_memory
# --measure` (transformers 5.25, peft 0.21, torch 2.13, on a CPU).
MODELS = (
    Decoder("Qwen3-0.6B", "qwen3", 1024, 28, 3072, 16, 8, 128, 151936, (63.1, 93.1), qk_norm=True),
    Decoder("Qwen2.5-1.5B", "qwen2", 1536, 28, 8960, 12, 2, 128, 151936, (64.8, 96.5), qkv_bias=True),
    Decoder("Mistral-7B-v0.1", "mistral", 4096, 32, 14336, 32, 8, 128, 32000, (45.7, 72.7)),
)


def memory(
    model: Decoder,
    batch: int,
    devices: int = DEVICES,
    chunk: int = CHUNK,
    length: int = LENGTH,
    rank: int = RANK,
    views: int = VIEWS,
) -> dict[str, float]:
    """Each term of the module docstring, in bytes per device."""
    rows = batch // devices  # b: rows per view and device
    units = chunk * length * model.hidden  # one chunk's tokens x hidden units, c S h
    plain, with_dropout = model.stored
    per_layer = plain * units
    dropout = (with_dropout - plain) * units
    trainable = model.lora_parameters(rank) + model.head_parameters()
    return {
        "weights": 2 * model.parameters() / devices,
        "gathered": 2 * max(model.layer_parameters(), model.embedding_parameters()),
        "trainable": 16 * trainable / devices,
        "activations": model.layers * per_layer,
        "korthikanti": model.layers * KORTHIKANTI * units,
        "scores": model.layers * 5 * model.heads * length * chunk * length,  # without FlashAttention
        "lora_dropout": model.layers * dropout,
        # Each layer's input kept; one layer's activations (LoRA dropout's too) while it is recomputed.
        "checkpointed": model.layers * CHECKPOINTED * units + per_layer + dropout,
        "embeddings": 2 * rows * views * model.hidden * 4,
        "logits": 3 * rows * (views - 1) * batch * 4,
    }


def totals(terms: dict[str, float]) -> tuple[float, float]:
    """Per device, with LoRA dropout and FlashAttention: without checkpointing, and with it."""
    fixed = terms["weights"] + terms["gathered"] + terms["trainable"] + terms["embeddings"] + terms["logits"]
    return fixed + terms["activations"] + terms["lora_dropout"], fixed + terms["checkpointed"]


def largest_chunk(model: Decoder, batch: int, budget_gib: float = BUDGET_GIB) -> int:
    """The largest chunk (rows) whose total without checkpointing stays within the budget."""
    one = memory(model, batch, chunk=1)
    per_row = one["activations"] + one["lora_dropout"]
    fixed = totals(one)[0] - per_row
    return int((budget_gib * GIB - fixed) // per_row)


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def shapes_table() -> str:
    lines = [
        "| model | layers | hidden | MLP | heads / KV heads | vocabulary | parameters | LoRA r = 16 | head "
        "| A, LoRA dropout 0 / 0.1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in MODELS:
        lines.append(
            f"| {m.name} | {m.layers} | {m.hidden:,} | {m.intermediate:,} | {m.heads} / {m.kv_heads} | {m.vocab:,} | "
            f"{m.parameters():,} | {m.lora_parameters(RANK):,} | {m.head_parameters():,} "
            f"| {m.stored[0]} / {m.stored[1]} |"
        )
    return "\n".join(lines)


def memory_table() -> str:
    lines = [
        "| model | B | frozen weights | gathered | LoRA + head, Adam | activations, one chunk | LoRA dropout "
        "| checkpointed instead | embeddings + grads | logits | total | total, checkpointed "
        f"| largest chunk in {BUDGET_GIB} GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in MODELS:
        for batch in BATCHES:
            t = memory(m, batch)
            plain, checkpointed = totals(t)
            cells = [t[k] for k in ("weights", "gathered", "trainable", "activations", "lora_dropout", "checkpointed")]
            cells += [t["embeddings"], t["logits"], plain, checkpointed]
            lines.append(
                f"| {m.name} | {batch:,} | " + " | ".join(_gib(c) for c in cells) + f" | {largest_chunk(m, batch)} |"
            )
    return "\n".join(lines)


def notes() -> str:
    first = [memory(m, BATCHES[0]) for m in MODELS]
    korthikanti = ", ".join(f"{m.name} {_gib(t['korthikanti'])}" for m, t in zip(MODELS, first))
    scores = ", ".join(f"{m.name} {_gib(t['scores'])}" for m, t in zip(MODELS, first))
    return (
        f"Korthikanti's 34 bytes would give one chunk's activations as, in GiB: {korthikanti}.\n"
        f"Without FlashAttention the attention scores (5 a S^2 c per layer) add, in GiB: {scores}."
    )


def main_tables() -> str:
    return "\n\n".join(
        [
            f"GiB per device: N = {DEVICES} devices, ZeRO-3, bf16, LoRA r = {RANK} on every linear layer with "
            f"dropout 0.1, chunks of c = {CHUNK} rows of S = {LENGTH} tokens, {VIEWS} text columns "
            "(simcse_sup triplets), FlashAttention.",
            shapes_table(),
            memory_table(),
            notes(),
        ]
    )


# ---------------------------------------------------------------- --measure (torch, transformers, peft)


def stored_bytes(model: Decoder, dropout: float, rows: int = 2, length: int = 64) -> float:
    """A: bytes autograd saves per token and hidden unit and layer in one training forward of
    ``model`` at 1/NARROWER of its width in bf16 (as DeepSpeed's bf16 casts the module, LoRA
    adapters included), with LoRA of rank RANK on every linear layer: 3 layers less 1, halved."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModel

    hidden = model.hidden // NARROWER

    def saved(layers: int) -> int:
        torch.manual_seed(0)
        config = AutoConfig.for_model(
            model.model_type,
            hidden_size=hidden,
            intermediate_size=model.intermediate // NARROWER,
            num_attention_heads=model.heads,
            num_key_value_heads=model.kv_heads,
            head_dim=model.head_dim // NARROWER,
            num_hidden_layers=layers,
            vocab_size=128,
            attn_implementation="sdpa",
        )
        lora = peft.LoraConfig(
            r=RANK,
            lora_alpha=2 * RANK,
            lora_dropout=dropout,
            target_modules="all-linear",
            task_type=peft.TaskType.FEATURE_EXTRACTION,
        )
        net = peft.get_peft_model(AutoModel.from_config(config), lora).to(torch.bfloat16).train()
        weights = {p.untyped_storage().data_ptr() for p in net.parameters()}
        stored: dict[int, int] = {}  # by storage: views of one tensor count once

        def keep(tensor):
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in weights:
                stored[pointer] = tensor.untyped_storage().nbytes()
            return tensor

        ids = torch.randint(0, 128, (rows, length))
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            net(input_ids=ids, attention_mask=torch.ones_like(ids))
        return sum(stored.values())

    return (saved(3) - saved(1)) / 2 / (rows * length * hidden)


def counted(model: Decoder) -> tuple[int, int]:
    """The base model's parameters as transformers builds it (on the meta device: no memory) and
    the trainable ones peft's all-linear LoRA of rank RANK adds."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModel

    shape = dict(
        hidden_size=model.hidden,
        intermediate_size=model.intermediate,
        num_attention_heads=model.heads,
        num_key_value_heads=model.kv_heads,
        head_dim=model.head_dim,
        num_hidden_layers=model.layers,
        vocab_size=model.vocab,
    )
    with torch.device("meta"):
        net = AutoModel.from_config(AutoConfig.for_model(model.model_type, **shape))
    total = sum(p.numel() for p in net.parameters())
    lora = peft.LoraConfig(r=RANK, target_modules="all-linear", task_type=peft.TaskType.FEATURE_EXTRACTION)
    adapted = peft.get_peft_model(net, lora)
    return total, sum(p.numel() for p in adapted.parameters() if p.requires_grad)


def measure() -> str:
    lines = [
        "| model | A, LoRA dropout 0 | A, dropout 0.1 | parameters (transformers) | LoRA r = 16 (peft) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in MODELS:
        total, lora = counted(m)
        assert (total, lora) == (m.parameters(), m.lora_parameters(RANK)), (m.name, total, lora)
        lines.append(f"| {m.name} | {stored_bytes(m, 0.0):.1f} | {stored_bytes(m, 0.1):.1f} | {total:,} | {lora:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="measure A and check the counts (needs torch)")
    args = parser.parse_args(argv)
    print(measure() if args.measure else main_tables())


if __name__ == "__main__":
    main()
