"""Which of the 19 actions are positive engagement and which are negative feedback.

The action columns are ``phoenix.config.ACTION_NAMES`` (the original runners' ACTIONS list) and
the negative ones ``phoenix.config.NEGATIVE_ACTIONS``; this module only derives the split the
user state needs from them and packs an action set into one integer (bit i = column i).

- The ranking history keeps every engagement, negative feedback included: the ranker learns
  from "this user muted an author like this one" as much as from a favorite.
- The retrieval history keeps positive engagement only: the user tower turns the history into
  one query vector, and a reported or muted post in it would pull posts like it closer.
  Positive = every action that is not negative feedback (favorite ... follow_author, dwell and
  dwell_time included: each says the user spent attention on the post by choice). An event that
  carries a negative action is not positive, whatever else it carries.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from phoenix.config import ACTION_NAMES, NEGATIVE_ACTIONS

NUM_ACTIONS = len(ACTION_NAMES)
ACTION_BIT = {name: 1 << i for i, name in enumerate(ACTION_NAMES)}
POSITIVE_ACTIONS = tuple(name for name in ACTION_NAMES if name not in NEGATIVE_ACTIONS)
NEGATIVE_MASK = sum(ACTION_BIT[name] for name in NEGATIVE_ACTIONS)
POSITIVE_MASK = sum(ACTION_BIT[name] for name in POSITIVE_ACTIONS)


def action_mask(names: Iterable[str]) -> int:
    """The bits of ``names``; a ValueError names an unknown action."""
    mask = 0
    for name in names:
        if name not in ACTION_BIT:
            raise ValueError(f"unknown action {name!r}; expected one of {', '.join(ACTION_NAMES)}")
        mask |= ACTION_BIT[name]
    return mask


def action_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in ``mask``, in column order."""
    return tuple(name for name in ACTION_NAMES if mask & ACTION_BIT[name])


def is_positive(mask: int) -> bool:
    """Positive engagement: at least one positive action and no negative feedback."""
    return bool(mask & POSITIVE_MASK) and not mask & NEGATIVE_MASK


def action_flags(masks: np.ndarray) -> np.ndarray:
    """Masks [L] -> action flags [L, 19] float32 (the ranker's ``history_actions``)."""
    bits = np.arange(NUM_ACTIONS, dtype=np.uint32)
    return ((masks.astype(np.uint32)[:, None] >> bits) & 1).astype(np.float32)


def action_bits(flags: np.ndarray) -> np.ndarray:
    """Action flags [..., A] (0/1 of any dtype) -> masks [...] uint32, bit i = column i: the
    inverse of ``action_flags``."""
    weights = np.uint32(1) << np.arange(np.shape(flags)[-1], dtype=np.uint32)  # [A]
    return ((np.asarray(flags) > 0.5).astype(np.uint32) * weights).sum(axis=-1, dtype=np.uint32)
