"""Distillation from a teacher's scores per (anchor, candidate): KL and MarginMSE.

A row of the data carries the teacher's scores of its anchor against its n = 1 + N candidates,
its positive then its N hard negatives (the ``scores`` column, written by ``data prepare
--score-field`` or ``data mine --teacher``). The student's scores are the cosines of the
embeddings e the model exports and evaluation reads (before the projection head: the teacher
scored texts, and the head is not kept), so what is distilled is the ranking retrieval uses.

- ``distill_kl`` (tevatron's and FlagEmbedding's knowledge distillation, sentence-transformers'
  DistillKLDivLoss): KL(p_teacher || p_student) over each anchor's candidates, p_teacher =
  softmax(t / teacher_temperature), p_student = softmax(s / temperature);
- ``margin_mse`` (Hofstaetter et al. 2020, sentence-transformers' MarginMSELoss): the mean over
  the anchor's N hard negatives of ((s_+ - s_-) - (t_+ - t_-))^2, the teacher's scores on the
  student's cosine scale (an encoder teacher's cosines; a reranker's logits want a rescale).

Both are means over the rows of one rank and each row is its own: no candidate of another rank
enters, so the mean over ranks (what DDP, ZeRO and FSDP2 average) is the global batch's mean
without any communication. Pure maths on tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vascl_scale.losses.contrastive import full_precision


def student_scores(anchor: Tensor, candidates: list[Tensor]) -> Tensor:
    """Cosines of each anchor (b, d) with its own n candidates ((b, d) each) -> (b, n), in
    float32 or wider."""
    with full_precision(anchor) as dtype:
        anchors = F.normalize(anchor.to(dtype), dim=-1)[:, None, :]  # (b, 1, d)
        stacked = F.normalize(torch.stack([c.to(dtype) for c in candidates], dim=1), dim=-1)  # (b, n, d)
        return (anchors * stacked).sum(dim=-1)  # (b, n)


def check_teacher_scores(teacher: Tensor, student: Tensor) -> None:
    """One finite teacher score per (anchor, candidate): (b, n) like the student's."""
    if teacher.shape != student.shape:
        raise ValueError(
            f"the data's scores hold {tuple(teacher.shape)[1:]} score(s) per row where the objective scores "
            f"{student.shape[1]} candidate(s) (the positive and {student.shape[1] - 1} hard negative(s)); write one "
            "teacher score per candidate, positive first (`vascl-scale data prepare --score-field`)"
        )


def distill_kl_loss(student: Tensor, teacher: Tensor, temperature: float, teacher_temperature: float) -> Tensor:
    """Mean over the b rows of KL(softmax(teacher / teacher_temperature) || softmax(student /
    temperature)), both (b, n) -> scalar."""
    check_teacher_scores(teacher, student)
    with full_precision(student) as dtype:
        log_student = F.log_softmax(student.to(dtype) / temperature, dim=-1)  # (b, n)
        log_teacher = F.log_softmax(teacher.to(dtype) / teacher_temperature, dim=-1)  # (b, n)
        return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")


def margin_mse_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean over the b rows and their N = n - 1 hard negatives of ((s_+ - s_-) - (t_+ - t_-))^2,
    both (b, n) with the positive in column 0 -> scalar."""
    check_teacher_scores(teacher, student)
    with full_precision(student) as dtype:
        student, teacher = student.to(dtype), teacher.to(dtype)
        student_margin = student[:, :1] - student[:, 1:]  # (b, N)
        teacher_margin = teacher[:, :1] - teacher[:, 1:]  # (b, N)
        return F.mse_loss(student_margin, teacher_margin)
