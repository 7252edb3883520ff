"""Model FLOPs of a training step, for achieved TFLOP/s and MFU (model FLOPs utilisation).

The count is of matrix products (2 FLOPs per multiply-add); normalisations, activations,
softmax and the optimiser update are left out (a few percent of a transformer's work).

Encoder forward of one sequence of T tokens (padding included: it is computed), per layer of
hidden size d and feed-forward size f (BERT, RoBERTa, MiniLM: :class:`EncoderShape`):

    Q, K, V and output projections   8 T d^2
    feed-forward (two matrices)      4 T d f
    attention scores and values      4 T^2 d

A backward pass costs twice its forward (gradients of inputs and of weights), so a training
step's encoder work is 3x the forward of its n views, n b sequences per device and loss call
(n = 2 for SimCSE and VaSCL, 2 + N for supervised SimCSE on N hard-negative columns).
The cached step's extra forward without gradient is recomputation and is not counted (as in
MFU's usual definition), so its MFU is lower than an uncached step's for the same speed.

Head passes (h: d -> d -> D, :class:`vascl_scale.model.ProjectionHead`) cost 2 (d^2 + d D)
per row forward, PairSupCon's pairwise classifier (3d -> classes) 2 x 3d x classes per pair;
each objective counts its own passes and similarity products (its ``model_flops``, which takes
the number of views).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncoderShape:
    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, config) -> EncoderShape | None:
        """From a Hugging Face config with BERT-style names; None for other architectures."""
        names = ("num_hidden_layers", "hidden_size", "intermediate_size")
        if not all(isinstance(getattr(config, name, None), int) for name in names):
            return None
        return cls(*(int(getattr(config, name)) for name in names))

    def forward_flops(self, sequences: int, tokens: int) -> int:
        """Forward FLOPs of ``sequences`` sequences of ``tokens`` tokens each."""
        d, f, t = self.hidden, self.intermediate, tokens
        return sequences * self.layers * (8 * t * d * d + 4 * t * d * f + 4 * t * t * d)


def head_forward_flops(rows: int, hidden: int, out_dim: int) -> int:
    """Forward FLOPs of the projection head on ``rows`` embeddings."""
    return 2 * rows * (hidden * hidden + hidden * out_dim)


def classifier_forward_flops(pairs: int, hidden: int, classes: int) -> int:
    """Forward FLOPs of the pairwise classifier (:class:`vascl_scale.model.PairClassifier`) on ``pairs`` pairs."""
    return 2 * pairs * 3 * hidden * classes


def tflops_and_mfu(flops: float, seconds: float, peak_tflops: float) -> tuple[float, float | None]:
    """Achieved TFLOP/s, and MFU (achieved / peak) when ``peak_tflops`` > 0."""
    achieved = flops / seconds / 1e12
    return achieved, (achieved / peak_tflops if peak_tflops > 0 else None)
