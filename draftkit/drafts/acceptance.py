"""Simulated greedy acceptance, shared by every draft kind: exact metrics from counts.

A kind's loss (drafts/<kind>/losses.py) counts, per draft step j over the positions that count:
    n_j, correct_j        positions, and those whose draft token equals the verifier's argmax
    cond_n_j, cond_correct_j   the same among positions whose steps 0..j-1 were all correct
    kl_sum_j, w_j         the step's summed loss and its weight in the total
and this module derives
    loss_j = kl_sum_j / n_j,  acc_j = correct_j / n_j,  cond_acc_j = cond_correct_j / cond_n_j
    loss   = sum_j w_j * loss_j
    sim_al = 1 + sum_k prod_{i<=k} cond_acc_i     (expected greedy acceptance length at k steps)
Metrics carry their counts, so `aggregate` over an eval set is exact, not a mean of batch means.
A training forward returns them as `DeviceMetrics`: the counts stay on the device until a
metric is read (the train loop reads them every tracking.log_every steps), so a step does not
wait for the device to report its counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

COUNT_KEYS = ("n", "correct", "cond_n", "cond_correct", "kl_sum")


def shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t] <- x[:, t+s] along dim 1, zero/False-filled at the end: [B, T, ...] -> same.
    What position t sees of the token (state, mask) s steps ahead; every kind uses it."""
    if s == 0:
        return x
    if s >= x.shape[1]:
        return torch.zeros_like(x)
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1)


def num_steps(metrics: dict) -> int:
    j = 0
    while f"n_{j}" in metrics:
        j += 1
    return j


def metrics_from_counts(counts: dict[str, float]) -> dict[str, float]:
    """Derived metrics (loss, loss_j, acc_j, cond_acc_j, sim_al) plus the counts themselves."""
    out = {k: float(v) for k, v in counts.items()}
    loss, steps = 0.0, num_steps(counts)
    for j in range(steps):
        n, cond_n = counts[f"n_{j}"], counts[f"cond_n_{j}"]
        out[f"loss_{j}"] = counts[f"kl_sum_{j}"] / n if n else 0.0
        out[f"acc_{j}"] = counts[f"correct_{j}"] / n if n else 0.0
        out[f"cond_acc_{j}"] = counts[f"cond_correct_{j}"] / cond_n if cond_n else 0.0
        loss += counts[f"w_{j}"] * out[f"loss_{j}"]
    out["loss"] = loss
    out["sim_al"] = simulated_al(out, steps)
    return out


def simulated_al(metrics: dict, k: int) -> float | None:
    """Expected greedy AL with k drafts: 1 + sum_{k'<k} prod_{i<=k'} cond_acc_i, from metrics
    holding cond_acc_0..k-1. Metrics of fewer TTT steps than k give their own `sim_al` (None if
    they have none): the draft was never trained that deep."""
    if k > 0 and f"cond_acc_{k - 1}" not in metrics:
        return metrics.get("sim_al")
    al, accepted_prob = 1.0, 1.0
    for j in range(k):
        accepted_prob *= float(metrics[f"cond_acc_{j}"])  # P(drafts 0..j all accepted)
        al += accepted_prob
    return al


def aggregate(metrics_list: list[dict]) -> dict[str, float]:
    """Exact metrics over many batches: sum the counts, then recompute the derived values."""
    if not metrics_list:
        return {}
    steps = num_steps(metrics_list[0])
    counts: dict[str, float] = {}
    for j in range(steps):
        for k in COUNT_KEYS:
            counts[f"{k}_{j}"] = sum(float(m[f"{k}_{j}"]) for m in metrics_list)
        counts[f"w_{j}"] = float(metrics_list[0][f"w_{j}"])
    return metrics_from_counts(counts)


class DeviceMetrics(Mapping):
    """Metrics derived (`derive`, default metrics_from_counts) from counts that may be device
    tensors: read on first access, all counts in one transfer, then a plain mapping of floats.
    counts: name -> 0-dim tensor or float."""

    def __init__(self, counts: dict[str, torch.Tensor | float],
                 derive: Callable[[dict[str, float]], dict[str, float]] = metrics_from_counts):
        self._counts, self._derive, self._values = counts, derive, None

    def resolve(self) -> dict[str, float]:
        if self._values is None:
            names = list(self._counts)
            tensors = [v for v in self._counts.values() if isinstance(v, torch.Tensor)]
            read = iter(torch.stack([t.detach().double() for t in tensors]).tolist()
                        if tensors else [])
            self._values = self._derive({n: next(read) if isinstance(v, torch.Tensor)
                                         else float(v)
                                         for n, v in zip(names, self._counts.values(),
                                                         strict=True)})
        return self._values

    def __getitem__(self, key: str) -> float:
        return self.resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())
