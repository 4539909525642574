"""Mixture of experts: the feed-forward sublayer as E expert FFNs and a router that sends each token to its
top-k of them (Shazeer et al. 2017, "Outrageously Large Neural Networks"; Mixtral, Jiang et al. 2024, §2.1).

    logits = x W_router                       (N, E), one score per expert
    p      = softmax(logits)                  over all experts, in fp32
    w, i   = topk(p, k);  w = w / sum(w)      Mixtral renormalises the k chosen weights to sum to 1
    y      = sum_j w_j * FFN_{i_j}(x)         each expert a SwiGLU FFN of its own

Parameters grow with E, the compute per token only with k: Mixtral 8x7B holds 47B parameters and uses 13B
per token. Each expert is an ordinary `FeedForward` (`experts.{j}.gate/up/down`), as Mixtral checkpoints
store them (`block_sparse_moe.experts.{j}.w1/w3/w2`).

A router left alone collapses onto a few experts; the load-balancing loss (Fedus et al. 2021, Switch
Transformer, eqs. 4-6) pushes towards a uniform share:
    aux = E * sum_e f_e * P_e,   f_e = top-k assignments to expert e per token,  P_e = mean router prob of e
(k when perfectly balanced: f_e = k/E, P_e = 1/E). The router z-loss (Zoph et al. 2022, ST-MoE, eq. 5)
keeps the logits small:  z = mean over tokens of logsumexp(logits)^2.

Each MoE module keeps its last forward's router logits (`router_logits`, (N, E)); the stack collects
them with `collect_router_logits` so that the block's interface stays the one every FFN has.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .feedforward import FeedForward


class MoEFeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.experts_top_k
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config) for _ in range(config.num_experts))
        self.router_logits: torch.Tensor | None = None

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (N, d) -> (router logits (N, E), weights (N, k) summing to 1 per token, expert ids (N, k))."""
        logits = self.router(h)
        probs = logits.float().softmax(-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(h.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        logits, weights, experts = self.route(h)
        self.router_logits = logits
        # Dispatch: sort the N*k (token, slot) pairs by expert, gather their inputs once, run each expert on
        # its contiguous slice, and add the weighted outputs back with one index_add (no E x N dense compute,
        # no padding to a capacity). At the char recipe's size the time is the experts' small matmuls, not
        # the dispatch (measured: one gather/scatter for all experts or one per expert, within noise).
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        routed = h[tokens]
        y = torch.cat([expert(part) for expert, part in zip(self.experts, routed.split(counts))])
        y = y * weights.flatten()[order, None]
        return torch.zeros_like(h).index_add_(0, tokens, y).view(shape)


def collect_router_logits(module: nn.Module) -> tuple[torch.Tensor, ...]:
    """The router logits of every MoE layer under `module` from its last forward pass, in layer order."""
    return tuple(m.router_logits for m in module.modules()
                 if isinstance(m, MoEFeedForward) and m.router_logits is not None)


def _masked_rows(router_logits: tuple[torch.Tensor, ...], attention_mask: torch.Tensor | None):
    """Per layer: (softmax probs (N, E) in fp32, row weights (N,): 1 for real tokens, 0 for padding)."""
    for logits in router_logits:
        probs = logits.float().softmax(-1)
        w = (torch.ones(probs.size(0), device=probs.device) if attention_mask is None
             else attention_mask.reshape(-1).to(probs.device, torch.float32))
        yield probs, w


def load_balancing_loss(router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """E * sum_e f_e P_e over all layers' tokens (Switch Transformer eq. 4, with top-k assignments counted
    as Mixtral's implementation does: f sums to k). Padding rows (attention_mask 0) are left out."""
    assigned = torch.zeros(num_experts, device=router_logits[0].device)
    prob = torch.zeros(num_experts, device=router_logits[0].device)
    rows = torch.zeros((), device=router_logits[0].device)
    for probs, w in _masked_rows(router_logits, attention_mask):
        chosen = probs.topk(top_k, dim=-1).indices                       # (N, k)
        assigned = assigned.scatter_add(0, chosen.flatten(), w.repeat_interleave(top_k))
        prob = prob + (probs * w[:, None]).sum(0)
        rows = rows + w.sum()
    return num_experts * torch.sum((assigned / rows) * (prob / rows))


def router_z_loss(router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """mean over tokens (and layers) of logsumexp(logits)^2 (ST-MoE, Zoph et al. 2022, eq. 5)."""
    return torch.stack([torch.logsumexp(lg.float(), -1).pow(2).mean() for lg in router_logits]).mean()


@torch.no_grad()
def expert_counts(router_logits: tuple[torch.Tensor, ...], top_k: int, num_experts: int) -> torch.Tensor:
    """(E,) top-k assignments per expert, summed over layers and tokens: divided by its sum, the share of
    the routed work each expert received (1/E each when balanced)."""
    counts = torch.zeros(num_experts, dtype=torch.float64)
    for logits in router_logits:
        chosen = logits.float().topk(top_k, dim=-1).indices.flatten().cpu()
        counts += torch.bincount(chosen, minlength=num_experts).double()
    return counts


def active_parameters(model: nn.Module) -> tuple[int, int]:
    """(parameters used per token, all parameters): an MoE layer's experts count k/E of their size in the
    first (the router and everything outside the FFN count whole). Tied tensors count once."""
    unique = lambda m: {id(p): p for p in m.parameters()}  # noqa: E731
    total = sum(p.numel() for p in unique(model).values())
    idle = 0
    for m in {id(m): m for m in model.modules() if isinstance(m, MoEFeedForward)}.values():
        idle += sum(p.numel() for p in unique(m.experts).values()) * (m.num_experts - m.top_k) // m.num_experts
    return total - idle, total
