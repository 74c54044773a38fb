"""The evaluation as text (a Markdown table) and as a PNG (learning curves, recall@k)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCORERS = ("trained", "random_weights", "popularity", "ground_truth")
LABELS = {
    "trained": "trained towers",
    "random_weights": "random weights",
    "popularity": "popularity",
    "ground_truth": "ground truth (ceiling)",
}
TABLE_AUC = ("favorite", "reply", "repost", "quote", "click", "not_interested")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown_table(evaluation: dict[str, Any]) -> str:
    """One row per scorer: recall@50/@200, NDCG@20 and the AUC of the main actions."""
    head = ["scorer", "recall@50", "recall@200", "NDCG@20"] + [f"AUC {a}" for a in TABLE_AUC]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scorer in SCORERS:
        metrics = evaluation.get(scorer)
        if metrics is None:
            continue
        auc = metrics.get("auc", {})
        cells = [LABELS[scorer]]
        cells += [_fmt(metrics.get(k)) for k in ("recall@50", "recall@200", "ndcg@20")]
        cells += [_fmt(auc.get(a)) for a in TABLE_AUC]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(evaluation: dict[str, Any]) -> list[tuple[str, bool]]:
    """The training targets (docs/training.md), each with whether it holds."""
    trained, truth = evaluation["trained"], evaluation["ground_truth"]
    pop = evaluation["popularity"]
    out = [
        (
            f"recall@50 {trained['recall@50']:.3f} >= half the ground truth's "
            f"({truth['recall@50']:.3f} / 2 = {truth['recall@50'] / 2:.3f})",
            trained["recall@50"] >= truth["recall@50"] / 2,
        ),
        (
            f"recall@50 {trained['recall@50']:.3f} > popularity {pop['recall@50']:.3f}",
            trained["recall@50"] > pop["recall@50"],
        ),
    ]
    for action in ("favorite", "reply", "repost"):
        value = trained["auc"][action]
        out.append(
            (
                f"AUC {action} {value:.3f} >= 0.75 (ground truth {truth['auc'][action]:.3f})",
                value >= 0.75,
            )
        )
    return out


def write_plot(summary: dict[str, Any], path: Path) -> None:
    """Learning curves of both phases and recall@k of every scorer, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, tower, key in (
        (axes[0], "retrieval", "retrieval"),
        (axes[1], "ranker", "ranker"),
    ):
        curve = summary["curves"].get(tower)
        if not curve:
            continue
        ax.plot(curve["steps"], curve["train"][key], label="training batches", alpha=0.7)
        if curve["eval"].get(key):
            ax.plot(curve["eval_steps"], curve["eval"][key], "o-", label="held-out batch")
        values = curve["train"][key] + curve["eval"].get(key, [])[1:]
        if values:  # the untrained first point would flatten the curve
            ax.set_ylim(min(values) * 0.95, max(values) * 1.05)
        ax.set_title(f"{tower} loss")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("in-batch softmax cross-entropy")
    axes[1].set_ylabel("sum of 19 per-action BCE")
    evaluation = summary.get("evaluation", {})
    ax = axes[2]
    for scorer in SCORERS:
        metrics = evaluation.get(scorer)
        if not metrics:
            continue
        ks = sorted(int(k.split("@")[1]) for k in metrics if k.startswith("recall@"))
        ax.plot(ks, [metrics[f"recall@{k}"] for k in ks], "o-", label=LABELS[scorer])
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k (held-out positives)")
    ax.set_title("retrieval recall@k")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(f"preset {summary['preset']}, seed {summary['seed']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
