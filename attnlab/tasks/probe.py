"""Warm-start a sequence classifier's head from a linear probe (LP-FT, Kumar et al. 2022, "Fine-Tuning can
Distort Pretrained Features and Underperform Out-of-Distribution", §4): fit a logistic regression on the
frozen sentence vectors of the training examples, copy it into the classifier, then fine-tune everything.
A random head's large early gradients move the pretrained features before the head is any good; with
a few hundred labels that distortion is most of what the model learns."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import collate, length_batches


@torch.no_grad()
def sentence_vectors(net, features: list[dict], pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """(n, hidden) float32: the vector `net`'s classifier reads for each feature, in input order, dropout off."""
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    out = torch.empty(len(features), net.config.hidden_size)
    for idx in length_batches([len(f["input_ids"]) for f in features], batch_size, shuffle=False):
        batch = {k: v.to(device) for k, v in collate([features[i] for i in idx], pad_id).items()
                 if k in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = net._run_backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        out[torch.tensor(idx)] = net.sentence_vector(hidden, batch["attention_mask"]).float().cpu()
    net.train(was_training)
    return out


def fit_logistic(x: torch.Tensor, y: torch.Tensor, num_classes: int, c: float = 1.0,
                 max_iter: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression, L2-penalised as scikit-learn's default (C=1: minimise
    C * sum of cross-entropies + ||W||^2 / 2, bias unpenalised), by full-batch L-BFGS. Returns (W, b)."""
    w = torch.zeros(num_classes, x.shape[1], requires_grad=True)
    b = torch.zeros(num_classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe")
    penalty = 1.0 / (2.0 * c * len(x))  # the same objective divided by C * n: a mean, well scaled

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ w.T + b, y) + penalty * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def probe_init(net, features: list[dict], pad_id: int) -> float:
    """Set `net.classifier` to the logistic regression fitted on its frozen sentence vectors; returns the
    probe's training accuracy (%)."""
    x = sentence_vectors(net, features, pad_id)
    y = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    w, b = fit_logistic(x, y, net.classifier.out_features)
    with torch.no_grad():
        net.classifier.weight.copy_(w.to(net.classifier.weight))
        net.classifier.bias.copy_(b.to(net.classifier.bias))
    return 100.0 * ((x @ w.T + b).argmax(-1) == y).float().mean().item()
