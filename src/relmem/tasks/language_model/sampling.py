"""Text generation from a trained language model: temperature, top-k or nucleus (top-p)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relmem.models.language_model import log_probs

__all__ = ["filter_top_k", "filter_top_p", "generate"]


def filter_top_k(logits: Tensor, k: int) -> Tensor:
    """``logits [..., V]`` with all but the ``k`` largest of each row set to ``-inf``."""
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: Tensor, p: float) -> Tensor:
    """``logits [..., V]`` keeping the smallest set of most likely tokens whose probability
    reaches ``p`` (nucleus sampling); the rest set to ``-inf``. ``p >= 1`` keeps every token."""
    if p >= 1:  # a float32 running sum can reach 1 before its last token
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.double().softmax(-1)
    before = probs.cumsum(-1) - probs  # mass above each token
    drop = before >= p  # the most likely token always stays
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Tensor,
    tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sample ``tokens`` ids continuing ``prompt``.

    Args:
        model: a language model, ``model(ids [1, T], state) -> (output, state)`` (eval mode).
        prompt: ``[P]`` int64 ids, ``P >= 1``.
        tokens: how many ids to sample.
        temperature: divides the log-probabilities; 0 takes the most likely token.
        top_k: sample among the ``top_k`` most likely tokens only.
        top_p: sample from the nucleus of probability ``top_p`` only.
        generator: the random stream (a seeded one makes the output reproducible).

    Returns:
        ``[tokens]`` int64 sampled ids.
    """
    if prompt.dim() != 1 or prompt.numel() < 1:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of ids, got {tuple(prompt.shape)}")
    if not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    output, state = model(prompt.to(device).view(1, -1), None)
    sampled = []
    for _ in range(tokens):
        scores = log_probs(output)[:, -1]  # [1, V]
        if temperature == 0:
            next_id = scores.argmax(-1, keepdim=True)  # [1, 1]
        else:
            # the best score at 0 first: a tiny temperature then sends the others to -inf
            # (not every score, which left softmax nothing but NaN)
            scores = (scores - scores.max(-1, keepdim=True).values) / temperature
            if top_k is not None:
                scores = filter_top_k(scores, top_k)
            if top_p is not None:
                scores = filter_top_p(scores, top_p)
            probs = scores.softmax(-1).cpu()
            next_id = torch.multinomial(probs, 1, generator=generator).to(device)
        sampled.append(int(next_id))
        output, state = model(next_id, state)
    model.train(was_training)
    return torch.tensor(sampled, dtype=torch.int64)
