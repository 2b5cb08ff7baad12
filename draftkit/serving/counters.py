"""Speculative-decoding counters in vLLM's terms (`vllm:spec_decode_*`): drafts, draft tokens,
accepted tokens per position; AL = 1 + accepted / drafts. vLLM's metrics and the reference
decoder both report through this one type.

vLLM's AL counts only the steps that carried a draft. n-gram drafts nothing where it finds no
match, so its AL leaves those steps out; `tokens_per_step` counts every target forward."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    drafts: int = 0  # verification steps that carried a draft
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def read(cls, llm) -> SpecCounters:
        c = cls()
        for m in llm.get_metrics():
            if m.name == "vllm:spec_decode_num_drafts":
                c.drafts += int(m.value)
            elif m.name == "vllm:spec_decode_num_draft_tokens":
                c.draft_tokens += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens":
                c.accepted += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                vals = [int(v) for v in m.values]
                pad = max(len(vals), len(c.accepted_per_pos))
                c.accepted_per_pos = [a + b for a, b in zip(  # noqa: B905 - padded equal
                    c.accepted_per_pos + [0] * (pad - len(c.accepted_per_pos)),
                    vals + [0] * (pad - len(vals)))]
        return c

    @classmethod
    def from_request_metrics(cls, metrics: list) -> SpecCounters:
        """The sum over requests of vLLM's per-request metrics (`RequestSpecDecodeMetrics`:
        `histogram[j]` = verify steps that accepted j draft tokens), so that only these
        requests count. A request without them (metrics off) raises ValueError: it cannot
        be measured, and reading it as AL 1.0 would blame the draft."""
        c = cls()
        for m in metrics:
            if m is None:
                raise ValueError("a request came back without per-request spec-decode metrics "
                                 "(start the engine with --per-request-spec-decode-metrics "
                                 "summary)")
            hist = list(m.histogram)  # e.g. [2, 1, 0, 3]: 6 steps, 1*1 + 3*3 = 10 accepted
            c.drafts += sum(hist)
            c.draft_tokens += int(m.num_draft_tokens)
            c.accepted += sum(j * n for j, n in enumerate(hist))
            pos = [sum(hist[i + 1:]) for i in range(len(hist) - 1)]  # accepted at position i
            pad = max(len(pos), len(c.accepted_per_pos))
            c.accepted_per_pos = [a + b for a, b in zip(  # noqa: B905 - padded equal
                c.accepted_per_pos + [0] * (pad - len(c.accepted_per_pos)),
                pos + [0] * (pad - len(pos)))]
        return c

    def delta(self, before: SpecCounters) -> SpecCounters:
        pos = [a - (before.accepted_per_pos[i] if i < len(before.accepted_per_pos) else 0)
               for i, a in enumerate(self.accepted_per_pos)]
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, pos)

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []

    def as_dict(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted": self.accepted, "accepted_per_pos": self.accepted_per_pos,
                "acceptance_length": self.acceptance_length, "per_position": self.per_position}


def target_steps(output_tokens: int, accepted: int) -> int:
    """Target forward steps summed over requests: each step emits one token the target chose
    (the bonus or corrected token, or the only token where nothing was drafted) plus the draft
    tokens it accepted, so steps = output tokens - accepted draft tokens."""
    return output_tokens - accepted


def tokens_per_step(output_tokens: int, accepted: int) -> float:
    """Output tokens per target forward, over every step, drafted or not (the EAGLE papers'
    tau): the AL that decides speed. Equals vLLM's AL for a draft that drafts every step."""
    steps = target_steps(output_tokens, accepted)
    return output_tokens / steps if steps > 0 else float("nan")
