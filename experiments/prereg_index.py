"""The table of every pre-registered study, at the top of docs/results.md.

One row per pre-registered hypothesis: the study (linked to its section), the hypothesis, the
mean per-seed difference with its two-sided 95% paired t-interval, the Holm-adjusted one-sided
p over the study's family, and the verdict at 0.05.  A study whose runs are not all logged gets
one row saying how many are (its pre-registration's stopping rule: no analysis before all
exist); a descriptive study (no hypothesis) gets one row saying so.  Every number comes from the
logs through the study's own driver (its ``loaded``, ``confirmatory``, ``ARMS`` and ``SEEDS``);
this module formats them and imports no report module (``compare.py`` imports it).

    from prereg_index import index_table
    print("\\n".join(index_table()))
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import NamedTuple

from prereg_tables import interval
from stats import holm, paired_t


class Study(NamedTuple):
    """A pre-registered study: its driver module, its name on the page, and its section."""

    module: str  # experiments/<module>.py with loaded(), confirmatory(have), ARMS, SEEDS
    title: str
    link: str  # relative to docs/


STUDIES = (
    Study("replication", "Long responses, fresh seeds 5-9 (MXFP4 rollouts)",
          "#replication-on-fresh-seeds-pre-registered"),
    Study("llada_ratio", "LLaDA: trajectory vs estimator ratio (FP8 E4M3)",
          "results_llada.md#the-corrections-ratio-estimator-vs-trajectory-pre-registered"),
    Study("smollm2_fp4", "SmolLM2-135M, NVFP4 rollouts",
          "#smollm2-135m-instruct-with-nvfp4-rollouts-pre-registered"),
    Study("async_staleness", "Asynchronous rollouts, staleness 1 and 4 (FP8 E4M3)",
          "#asynchronous-rollouts-staleness-and-fp8-in-one-correction-pre-registered"),
    Study("staleness_followup", "Staleness k = 4: AIS vs naive PPO, and at lr 2.5e-5 (FP8 E4M3)",
          "#staleness-follow-up-naive-ppo-and-a-smaller-step-pre-registered"),
    Study("llada_complete_ratio", "LLaDA: AIS with the complete trajectory ratio (FP8 E4M3)",
          "results_llada.md#the-complete-trajectory-ratio-ais-against-fp8-and-the-estimator-"
          "pre-registered"),
)
DESCRIPTIVE = (  # pre-registered without a hypothesis test
    Study("smollm2_mechanism", "SmolLM2-135M, FP8 E4M3 rollouts (2 seeds)",
          "#a-pretrained-model-smollm2-135m-instruct-with-fp8-e4m3-rollouts"),
)


def study_rows(title: str, link: str, logged: int, total: int,
               hypotheses: Sequence[tuple[str, Sequence[float]]],
               alpha: float = 0.05) -> list[str]:
    """The table rows of one study: one per hypothesis ``(label, per-seed differences)`` when
    all ``total`` runs are logged, else one row with the count.

    Each hypothesis is tested one-sided (mean > 0) by the paired t-test; Holm's step-down
    correction runs over the study's hypotheses (its pre-registered family) at ``alpha``.
    """
    name = f"[{title}]({link})"
    if logged < total:
        return [f"| {name} | {len(hypotheses) or '-'} pre-registered | - | - | "
                f"{logged} of {total} runs logged: not analysed yet |"]
    tests = {h: paired_t(d, "greater") for h, d in hypotheses}
    adj = holm({h: t.p for h, t in tests.items()}, alpha)
    return [f"| {name} | {h} | {interval(d)} | {adj[h][0]:.3f} | "
            f"{'supported' if adj[h][1] else 'not supported'} at {alpha:g} |"
            for h, d in hypotheses]


def index_table() -> list[str]:
    """The markdown table of every pre-registered study (`STUDIES`, then `DESCRIPTIVE`)."""
    out = ["| study | hypothesis (held-out sampled accuracy after GRPO) | mean difference "
           "[95% t-interval] | Holm p (one-sided) | verdict |", "|---|---|---|---|---|"]
    for s in STUDIES:
        mod = importlib.import_module(s.module)
        have = mod.loaded()
        total = len(mod.ARMS) * len(mod.SEEDS)
        hyps = mod.confirmatory(have) if len(have) == total else [
            (f"{h}: {a} - {b} > 0", []) for h, a, b in mod.HYPOTHESES]
        out += study_rows(s.title, s.link, len(have), total, hyps)
    for s in DESCRIPTIVE:
        out.append(f"| [{s.title}]({s.link}) | none (descriptive) | - | - | - |")
    return out
