"""The feed policy after the ranker: filters, a weighted score over every action, author
diversity. Pure numpy, one user row at a time; the service (``serving.services.feed_policy``)
parses the parameters and the requests around it.

The stages follow X's home-mixer (its weighted scorer, author-diversity scorer and filters),
in the order that makes each one see what it should:

1. filters drop the posts the user must not get (excluded authors, seen posts, too old, the
   user's own, duplicates): they run first, so a dropped post never takes an author's
   diversity slot;
2. the weighted score sums every action probability times its weight; negative weights
   (not_interested, block, mute, report) pull a post down, and a negative sum is mapped into
   [0, offset) so every score stays >= 0 and in order (``offset_negative_scores``);
3. author diversity multiplies an author's k-th post (k = 0 for the first, in the order of
   step 2) by ``(1 - floor) * decay**k + floor``;
4. an out-of-network post (one not from the followed authors' newest posts) is multiplied by
   ``out_of_network_factor`` (in [0, 1]), as X's out-of-network scorer does after its author
   diversity; scores are >= 0 by then (step 2), so the factor can only lower an
   out-of-network post, never raise it; the feed is sorted by the result.

Shape glossary: C candidates of one user row, A actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class PolicySettings:
    """The policy's parameters, checked (``phoenix.stub.services.feed_policy.parse_settings``)."""

    action_weights: np.ndarray  # [A] float64, by the artifact's action order
    negative_scores_offset: float  # >= 0
    author_diversity_decay: float  # in [0, 1]
    author_diversity_floor: float  # in [0, 1]
    filter_own_posts: bool
    out_of_network_factor: float = 1.0  # in [0, 1]; 1: in- and out-of-network alike


@dataclass(frozen=True)
class FeedFilters:
    """What one user row's feed must leave out; None: that filter is off."""

    user_id: Optional[int] = None  # the user's own posts (when filter_own_posts)
    excluded_author_ids: Optional[np.ndarray] = None  # blocked or muted authors
    seen_post_ids: Optional[np.ndarray] = None  # posts already seen or served
    max_age_seconds: Optional[float] = None  # posts older than this
    post_ages_seconds: Optional[np.ndarray] = None  # [C], NaN where the creation time is unknown


# ----------------------------------------------------------------------------------------
# Filters: each returns a [C] mask of the posts that stay
# ----------------------------------------------------------------------------------------


def first_occurrences(post_ids: np.ndarray) -> np.ndarray:
    """True at the first (best-ranked) copy of each post id: a feed shows a post once."""
    _, first = np.unique(post_ids, return_index=True)
    keep = np.zeros(post_ids.shape, bool)
    keep[first] = True
    return keep


def not_in(ids: np.ndarray, excluded: Optional[np.ndarray]) -> np.ndarray:
    """True where ``ids`` is not among ``excluded`` (None or empty excludes nothing)."""
    if excluded is None or excluded.size == 0:
        return np.ones(ids.shape, bool)
    return ~np.isin(ids, excluded)


def young_enough(ages: Optional[np.ndarray], max_age: Optional[float], count: int) -> np.ndarray:
    """True where a post's age is at most ``max_age``; a post of unknown age (NaN) stays: the
    age filter applies only where the corpus knows the creation time."""
    if max_age is None or ages is None:
        return np.ones(count, bool)
    return ~(ages > max_age)  # NaN > x is False: unknown ages stay


# The filters by name, in the order a dropped post is blamed on (its first filter here).
FILTERS = ("duplicate", "own_post", "excluded_author", "seen", "too_old")


def filter_masks(
    post_ids: np.ndarray, author_ids: np.ndarray, filters: FeedFilters
) -> dict[str, np.ndarray]:
    """{filter name: [C] True for the posts it lets through}, in ``FILTERS`` order."""
    own = None if filters.user_id is None else np.array([filters.user_id])
    masks = {
        "duplicate": first_occurrences(post_ids),
        "own_post": not_in(author_ids, own),
        "excluded_author": not_in(author_ids, filters.excluded_author_ids),
        "seen": not_in(post_ids, filters.seen_post_ids),
        "too_old": young_enough(filters.post_ages_seconds, filters.max_age_seconds, len(post_ids)),
    }
    return {name: masks[name] for name in FILTERS}


def passes_all(masks: dict[str, np.ndarray]) -> np.ndarray:
    """[C] True for the posts every filter of ``masks`` lets through."""
    return np.logical_and.reduce(list(masks.values()))


def keep_mask(post_ids: np.ndarray, author_ids: np.ndarray, filters: FeedFilters) -> np.ndarray:
    """[C] True for the posts every filter lets through."""
    return passes_all(filter_masks(post_ids, author_ids, filters))


def dropped_counts(masks: dict[str, np.ndarray]) -> np.ndarray:
    """[F] int64: posts dropped per filter (``FILTERS`` order), each post counted once, under
    the first filter that drops it, so the counts add up to the posts dropped: an empty feed
    says why."""
    counted = np.zeros_like(next(iter(masks.values())))  # dropped by an earlier filter
    counts = np.zeros(len(FILTERS), np.int64)
    for slot, name in enumerate(FILTERS):
        dropped = ~masks[name] & ~counted
        counts[slot] = int(dropped.sum())
        counted |= dropped
    return counts


# ----------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------


def weighted_scores(action_probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[C] sum over actions of probability times weight (float64, so ties are the data's)."""
    return action_probs.astype(np.float64) @ weights.astype(np.float64)


def offset_negative_scores(scores: np.ndarray, weights: np.ndarray, offset: float) -> np.ndarray:
    """Scores moved to >= 0, in the same order: ``s + offset`` for ``s >= 0``, and for a
    negative ``s`` (possible only through negative weights) ``(s + N) / W * offset``.

    N is the sum of the negative weights' magnitudes, so ``s + N >= 0`` for probabilities in
    [0, 1]; W is the sum of every weight's magnitude (N plus the positive sum), so a negative
    score lands in ``[0, offset * N / W)``, below every non-negative one: the map increases
    with ``s`` and a higher block or report probability never raises a post. With no weights
    at all, scores are clipped at 0.
    """
    negative = float(-weights[weights < 0].sum())
    total = float(np.abs(weights).sum())
    if total == 0.0:
        return np.maximum(scores, 0.0)
    return np.where(scores < 0, (scores + negative) / total * offset, scores + offset)


def occurrence_index(values: np.ndarray) -> np.ndarray:
    """[C] k for the k-th occurrence (from 0) of each value, counting in array order."""
    order = np.argsort(values, kind="stable")  # equal values keep their array order
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    positions = np.arange(len(values))
    group_start = np.maximum.accumulate(np.where(starts, positions, 0))
    index = np.empty(len(values), np.int64)
    index[order] = positions - group_start
    return index


def diversity_multipliers(occurrence: np.ndarray, decay: float, floor: float) -> np.ndarray:
    """``(1 - floor) * decay**k + floor`` for an author's k-th post: 1 for the first, then
    decaying towards ``floor``, so a prolific author is damped but never silenced."""
    return (1.0 - floor) * np.power(decay, occurrence) + floor


# ----------------------------------------------------------------------------------------
# One user row
# ----------------------------------------------------------------------------------------


def network_multipliers(in_network: Optional[np.ndarray], factor: float) -> np.ndarray:
    """1 for an in-network post, ``factor`` for an out-of-network one ([C'] of ``in_network``
    flags; None: every post out-of-network)."""
    if in_network is None:
        return np.asarray(factor, np.float64)
    return np.where(in_network, 1.0, factor)


def in_network_share(in_network: np.ndarray) -> float:
    """The share of a feed's posts that are in-network (0 for an empty feed)."""
    return float(np.mean(in_network)) if len(in_network) else 0.0


def rank_kept(
    kept: np.ndarray,
    author_ids: np.ndarray,
    action_probs: np.ndarray,
    settings: PolicySettings,
    in_network: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(``kept`` positions reordered best first; their final scores): the weighted score,
    then author diversity, then the out-of-network factor (``in_network``: [C] flags of every
    candidate; None: none is in-network)."""
    weights = settings.action_weights
    scores = offset_negative_scores(
        weighted_scores(action_probs[kept], weights), weights, settings.negative_scores_offset
    )
    by_score = np.argsort(-scores, kind="stable")  # an author's k-th post counts in this order
    multipliers = diversity_multipliers(
        occurrence_index(author_ids[kept[by_score]]),
        settings.author_diversity_decay,
        settings.author_diversity_floor,
    )
    flags = None if in_network is None else in_network[kept[by_score]]
    final = (
        scores[by_score] * multipliers * network_multipliers(flags, settings.out_of_network_factor)
    )
    order = np.argsort(-final, kind="stable")
    return kept[by_score[order]], final[order]


def apply_policy(
    post_ids: np.ndarray,
    author_ids: np.ndarray,
    action_probs: np.ndarray,
    settings: PolicySettings,
    filters: FeedFilters,
    in_network: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(positions into the row's candidates, best first; their final scores) of one user row.

    Candidates come in the ranker's order; equal scores keep that order (stable sorts).
    ``in_network``: [C] True for the candidates from the in-network source (None: none).
    """
    kept = np.flatnonzero(keep_mask(post_ids, author_ids, filters))
    return rank_kept(kept, author_ids, action_probs, settings, in_network)
