"""Training presets: the synthetic world, the model shapes and the optimisation settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from phoenix.artifact_parts import Preset, preset_config
from phoenix.config import ACTION_NAMES, ArtifactConfig
from phoenix.training.train import TrainSettings
from phoenix.world.synthetic import WorldSpec


@dataclass(frozen=True)
class TrainPreset:
    """Everything one ``python -m phoenix.training pipeline --preset NAME`` run needs."""

    description: str
    world: WorldSpec
    model: Preset
    settings: TrainSettings  # batch sizes and learning rate of both phases
    retrieval_steps: int
    ranker_steps: int
    eval_users: int = 2000
    eval_candidates: int = 64  # held-out impressions per evaluation request
    eval_every: int = 100
    for_accelerators: bool = False  # hours per phase on a few CPU cores

    def cpu_warning(self, backend: str) -> str | None:
        """What to tell a user who trains an accelerator-sized preset on a CPU."""
        if not self.for_accelerators or backend != "cpu":
            return None
        return (
            "warning: this preset is sized for a GPU and JAX sees none: on a few CPU cores it "
            "takes hours (the progress bars show the estimate); --preset demo trains in minutes"
        )

    def phases(self, seed: int) -> list[TrainSettings]:
        """Two phases: the retrieval tower learns the shared hash tables, then the ranker
        learns on top of them with the tables fixed, so the corpus embedded after training
        matches the tables both towers are served with. A phase never moves the other
        tower's weights (``TrainSettings.trained_groups``)."""
        base = dataclasses.replace(self.settings, seed=seed)
        return [
            dataclasses.replace(base, steps=self.retrieval_steps, towers=("retrieval",)),
            dataclasses.replace(
                base,
                steps=self.ranker_steps,
                towers=("ranker",),
                frozen=("tables",),
            ),
        ]

    def config(self, seed: int) -> ArtifactConfig:
        """The artifact config: the model preset's shapes and hash functions from ``seed``,
        right-anchored RoPE (a candidate's score is independent of its slot) and the
        original's 19 action names."""
        base = preset_config(self.model, seed)
        return dataclasses.replace(base, right_anchored_rope=True, action_names=ACTION_NAMES)


# model: fields in the order of phoenix.artifact_parts.PRESETS (emb, layers, heads, kv heads, key
# size, history, candidates, user / item / author vocabulary); corpus sizes 0, because the
# corpus is the logs' recent posts
PRESETS = {
    "tiny": TrainPreset(
        description="unit tests: 3k users, 4k posts, emb 32, 2 layers, a few hundred steps",
        world=WorldSpec(
            num_users=3_000,
            num_authors=120,
            num_posts=4_000,
            num_topics=8,
            num_days=6,
            sessions_per_day=1.0,
        ),
        model=Preset(32, 2, 2, 2, 16, 16, 16, 2_000, 8_000, 600, 0, 0),
        settings=TrainSettings(steps=0, ranker_batch=32, retrieval_batch=128, learning_rate=3e-3),
        retrieval_steps=300,
        ranker_steps=400,
        eval_users=500,
        eval_every=100,
    ),
    "demo": TrainPreset(
        description="make demo: 100k users, 24k posts, 16 topics, emb 64, 2 layers, history 16 "
        "(about 3 min on 2 cores)",
        world=WorldSpec(num_users=100_000, num_authors=500, num_posts=24_000),
        model=Preset(64, 2, 4, 4, 16, 16, 64, 5_000, 20_000, 1_000, 0, 0),
        settings=TrainSettings(steps=0, ranker_batch=64, retrieval_batch=256, learning_rate=3e-3),
        retrieval_steps=700,
        ranker_steps=2600,
        eval_users=2000,
        eval_every=250,
    ),
    "mini": TrainPreset(
        description="make train: 300k users, 100k posts, the published mini shapes (emb 128, "
        "4 layers, history 127); meant for a GPU",
        world=WorldSpec(num_users=300_000, num_authors=2_000, num_posts=100_000, num_days=10),
        model=Preset(128, 4, 4, 4, 32, 127, 64, 100_000, 100_000, 4_000, 0, 0),
        settings=TrainSettings(steps=0, ranker_batch=128, retrieval_batch=512, learning_rate=2e-3),
        retrieval_steps=4000,
        ranker_steps=8000,
        eval_users=5000,
        eval_every=500,
        for_accelerators=True,
    ),
}
