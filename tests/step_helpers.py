"""What the tests of the training step share (the cached step, torch.compile, the GPU): one fixed
global batch of random tokens, a TrainingStep on a tiny float64 encoder with an objective that
records VaSCL's neighbours and perturbation, and the comparisons of two loss calls."""

from __future__ import annotations

import torch

from tests.tiny import tiny_encoder, token_batch

GLOBAL_BATCH = 8
SEQ_LEN = 6
CHUNK = 3  # per-device batches of 8, 4 and 2 rows: chunks of 3, 3, 2 / 3, 1 / 2

# (objective, loss overrides): both unsupervised objectives (supervised SimCSE's triplets: its own test), detach true and false, relative and absolute strengths.
CASES = [
    ("vascl", {}),
    ("vascl", {"detach": False}),
    ("vascl", {"eps_mode": "relative", "xi_mode": "relative", "eps": 0.5, "xi": 0.5}),
    (
        "vascl",
        {"eps_mode": "relative_instance", "xi_mode": "relative_instance", "eps": 0.5, "xi": 0.5, "detach": False},
    ),
    ("simcse", {}),
]
CASE_IDS = ["vascl", "vascl-no-detach", "vascl-relative", "vascl-instance-no-detach", "simcse"]


def _config(objective: str, loss: dict, chunk_size: int, grad_accum_steps: int = 1, chunk_tokens: int = 0):
    from vascl_scale.config import config_from_dict

    return config_from_dict(
        {
            "objective": objective,
            "model": {"path": "tiny", "head_dim": 8},
            "data": {"train": "fixed batches"},
            "loss": {"k": 3, "temperature": 0.1, "xi": 1.0, "eps": 1.0, "power_iters": 2, **loss},
            "train": {
                "global_batch_size": GLOBAL_BATCH,
                "precision": "no",
                "seed": 5,
                "chunk_size": chunk_size,
                "chunk_tokens": chunk_tokens,
                "grad_accum_steps": grad_accum_steps,
            },
        }
    )


class RecordingObjective:
    """The configured objective, keeping VaSCL's neighbours and delta of each call."""

    def __init__(self, objective: str, loss) -> None:
        from vascl_scale.losses import build_objective

        self.name, self.loss, self.inner = objective, loss, build_objective(objective, loss.model_dump())
        self.spec = self.inner.spec
        self.needs_text_hashes, self.needs_guide = self.inner.needs_text_hashes, self.inner.needs_guide
        self.calls: list[dict[str, torch.Tensor]] = []

    def __call__(self, views, head, generator=None, with_stats=False, **declared):
        from vascl_scale.losses import ObjectiveOutput
        from vascl_scale.losses.vascl import vascl_objective

        if self.name != "vascl" or declared or self.loss.matryoshka_dims:  # records the plain VaSCL only
            return self.inner(views, head, generator, with_stats, **declared)
        e1, e2 = views
        out = vascl_objective(e1, e2, head, generator=generator, with_stats=False, **self.inner.keywords)
        self.calls.append({"neighbours": out.neighbours.clone(), "delta": out.delta.detach().clone()})
        return ObjectiveOutput(out.loss, {"simcse": out.simcse.detach()})

    def model_flops(self, *shape: int) -> int:
        return self.inner.model_flops(*shape)


def step_parts(
    objective: str,
    loss: dict,
    chunk_size: int,
    dropout: float,
    grad_accum_steps: int = 1,
    sgd: bool = False,
    chunk_tokens: int = 0,
    sort_chunks: bool = True,
    length_buckets: int = 1,
    fsdp=None,
    compile_blocks: bool = False,
    max_grad_norm: float = 0.0,
):
    """Accelerator, prepared model and optimiser, recording objective and TrainingStep (the cached
    step's chunks sorted by length unless ``sort_chunks`` is off; the uncached step's forwards in
    ``length_buckets`` length-sorted groups; ``fsdp``: the model sharded by these FSDP2 settings,
    its blocks compiled first with ``compile_blocks``)."""
    from vascl_scale.losses.spec import objective_spec
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    config = _config(objective, loss, chunk_size, grad_accum_steps, chunk_tokens)
    model = tiny_encoder(
        seed=0, dtype=torch.float64, head_dim=8, pair_classifier=objective_spec(objective).classifier,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    model.train()
    accelerator = build_accelerator(config, None, "no")
    if fsdp is not None:
        from vascl_scale.train.fsdp import shard_model

        shard_model(model, fsdp, "no", accelerator.device, compile_blocks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5) if sgd else build_optimizer(model, config)
    rows = config.per_device_batch_size(accelerator.num_processes)
    prepared, prepared_optimizer = prepare_for_training(accelerator, model, optimizer, config.train, rows)
    recorder = RecordingObjective(objective, config.loss)
    # loss.guide_model: another tiny encoder, frozen (its tokens are the batch's)
    guide = tiny_encoder(seed=7, dtype=torch.float64).eval().requires_grad_(False) if recorder.needs_guide else None
    step = TrainingStep(
        accelerator, prepared, prepared_optimizer, recorder, seed=config.train.seed, per_device_batch=rows,
        grad_accum_steps=grad_accum_steps, chunk_size=chunk_size, chunk_tokens=chunk_tokens,
        sort_chunks=sort_chunks, length_buckets=length_buckets,
        reduce_every_backward=fsdp is not None and fsdp.gradient_sync == "backward", max_grad_norm=max_grad_norm,
        guide=guide,
    )  # fmt: skip
    return accelerator, model, step, recorder


def own_batch(
    rank: int, world_size: int, seed: int = 10, positive: bool = False, negatives: int = 0
) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's rows of the global batch; ``positive``: with a positive column of other tokens
    (a labelled pair's, or data.augment's); ``negatives``: with that many hard-negative columns,
    negative_j of other tokens and j + 1 tokens narrower than the anchor (each column padded to
    its own longest, as the loader pads)."""
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    widths = {"anchor": SEQ_LEN, **({"positive": SEQ_LEN} if positive else {})}
    widths.update({f"negative_{j}": SEQ_LEN - 1 - j for j in range(negatives)})
    batch = {}
    for offset, (column, width) in enumerate(widths.items()):
        ids, mask = token_batch(GLOBAL_BATCH, width, seed=seed + 20 * offset)  # the same global batch everywhere
        batch[column] = {"input_ids": ids[own], "attention_mask": mask[own]}
    return batch


def parameter_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def same_mask_reference(step, batch: dict[str, torch.Tensor], loss_call: int):
    """A one-backward step whose forwards are the cached step's chunks (its plan: sorted, cut to
    their longest rows), with gradient, under the RNG states the cached step seeds: the dropout
    masks the cached step must reproduce. The columns encoded must have one width (nothing is widened here)."""
    from vascl_scale.lengths import restore_rows
    from vascl_scale.train.step import loss_call_seed

    rank = step.accelerator.process_index
    torch.manual_seed(loss_call_seed(step.seed, loss_call, rank))
    generator = torch.Generator().manual_seed(loss_call_seed(step.seed, loss_call, 0))
    columns = [batch[column] for column in step.objective.spec.encoded_columns(batch)]  # single text: the anchor twice
    spans = step.chunk_plan(columns)
    pieces = [step.model(**step.chunk_inputs(columns[view], rows)) for view, rows in spans]  # in the cached order
    views = [
        restore_rows([p for (v, _), p in zip(spans, pieces) if v == view], [r for v, r in spans if v == view])
        for view in range(len(columns))
    ]  # (b, d) each, in row order
    out = step.objective(views, step.head, generator, **step._declared_arguments(batch, columns))
    step.accelerator.backward(out.loss)
    return out


def assert_close_float64(got, expected, what: str) -> None:
    torch.testing.assert_close(
        torch.as_tensor(got), torch.as_tensor(expected), rtol=1e-9, atol=1e-11, msg=lambda m: f"{what}: {m}"
    )


def assert_same_call(got: dict, expected: dict, what: str) -> None:
    assert_close_float64(got["loss"], expected["loss"], f"{what}, loss")
    assert len(got["recorded"]) == len(expected["recorded"])
    for ours, theirs in zip(got["recorded"], expected["recorded"]):
        assert (ours["neighbours"] == theirs["neighbours"]).all(), what
        assert_close_float64(ours["delta"], theirs["delta"], f"{what}, delta")
    assert sorted(got["gradients"]) == sorted(expected["gradients"])
    for name, gradient in expected["gradients"].items():
        assert abs(gradient).max() > 0, f"{name} has no gradient: the comparison would prove nothing"
        assert_close_float64(got["gradients"][name], gradient, f"{what}, gradient of {name}")


def portable(value):
    """Tensors as numpy arrays, so that a rank's result survives its process (no shared memory)."""
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v) for v in value)
    return value


def call_and_backward(step, batch, mode: str):
    """Loss call 0 and its backward, "uncached" (one backward) or "cached" (the chunked step's own)."""
    if mode == "cached":
        return step.cached_loss_call(batch, 0, 0)
    out = step.loss_call(batch, 0)
    step._backward(out.loss, final=True)
    return out
