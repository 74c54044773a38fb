"""The feed's features beyond ids that X's production ranker reads, declared once: the posts'
semantic IDs, each impression's context (surface, times, timezone, local hour, dwell) and
the user's profile. Names, ranges and encodings follow X's release (its nano configuration
and batch format), so that the stores, the synthetic world and the production family's
contract agree; numpy only.

- **Semantic IDs**: ``SID_NUM_LEVELS`` codes per post, each in [1, ``SID_CODEBOOK_SIZE``]
  from coarse to fine (posts of one topic share a prefix), 0 where a post has none.
- **Impression context** (``HISTORY_FEATURES``, per history item): the product surface
  (X's 16), the impression and post creation times (Unix seconds, 0 unknown), the viewer's
  timezone (X's 32 buckets, 0 unknown), the local hour of day + 1 (1..24, 0 unknown:
  ``local_hour``), the dwell seconds and the post's semantic IDs.
- **User profile** (``PROFILE_FEATURES``): country, language, location, installed apps,
  profile and inferred gender, age bracket and years, and the home timezone; 0 is "unknown"
  for every categorical one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# -- semantic IDs ---------------------------------------------------------------------------

SID_NUM_LEVELS = 6  # codes per post (X's nano: sid_num_levels)
SID_CODEBOOK_SIZE = 256  # codes per level (X's sid_codebook_size); a code is 1..256
SID_MISSING = 0  # a post without a semantic ID has 0 at every level

# -- impression context ---------------------------------------------------------------------

NUM_PRODUCT_SURFACES = 16  # X's product surfaces, 0 (unknown) .. 15
NUM_HOURS_OF_DAY = 25  # 0 unknown, then the local hour + 1

# X's timezone buckets (0 unknown, 31 any other) and the UTC offset X turns each into a local
# hour with. The offsets are fixed (no daylight saving time), Sydney's included (+11), as X
# computes them: a model trained on X's data saw these hours.
TIMEZONES: tuple[tuple[str, float], ...] = (
    ("unknown", 0.0),
    ("America/New_York", -5.0),
    ("America/Chicago", -6.0),
    ("America/Los_Angeles", -8.0),
    ("America/Denver", -7.0),
    ("America/Sao_Paulo", -3.0),
    ("Europe/London", 0.0),
    ("Europe/Paris", 1.0),
    ("Europe/Berlin", 1.0),
    ("Europe/Madrid", 1.0),
    ("Europe/Rome", 1.0),
    ("Europe/Amsterdam", 1.0),
    ("Europe/Istanbul", 3.0),
    ("Europe/Moscow", 3.0),
    ("Asia/Tokyo", 9.0),
    ("Asia/Kolkata", 5.5),
    ("Asia/Shanghai", 8.0),
    ("Asia/Seoul", 9.0),
    ("Asia/Jakarta", 7.0),
    ("Asia/Bangkok", 7.0),
    ("Asia/Dubai", 4.0),
    ("Asia/Riyadh", 3.0),
    ("Asia/Manila", 8.0),
    ("Asia/Singapore", 8.0),
    ("Australia/Sydney", 11.0),
    ("Pacific/Honolulu", -10.0),
    ("America/Phoenix", -7.0),
    ("America/Toronto", -5.0),
    ("America/Mexico_City", -6.0),
    ("America/Argentina/Buenos_Aires", -3.0),
    ("Africa/Lagos", 1.0),
    ("other", 0.0),
)
NUM_TIMEZONES = len(TIMEZONES)
TIMEZONE_UNKNOWN = 0
TIMEZONE_OFFSET_S = np.array([hours * 3600.0 for _, hours in TIMEZONES])  # [32] float64


def local_hour(ts, timezone) -> np.ndarray:
    """The local hour of day + 1 (int32, 1..24) at Unix seconds ``ts`` in ``timezone``
    (arrays of one shape, or broadcasting); 0 where the time is unknown (``ts`` <= 0). An
    unknown timezone counts as UTC, and a bucket outside the table as its nearest, as X
    computes the hour."""
    ts = np.asarray(ts, np.float64)
    zone = np.clip(np.asarray(timezone, np.int64), 0, NUM_TIMEZONES - 1)
    seconds_of_day = np.mod(ts + TIMEZONE_OFFSET_S[zone], 86_400.0)
    hour = np.minimum(seconds_of_day // 3600.0, 23).astype(np.int32)
    return np.where(ts > 0, hour + 1, 0).astype(np.int32)


# -- the user's profile ---------------------------------------------------------------------

NUM_COUNTRIES = 250  # X's nano: num_countries
NUM_LANGUAGES = 200  # num_languages
NUM_INSTALLED_APPS = 64  # num_installed_apps
NUM_PROFILE_GENDERS = 3  # 0 not given, 1 male, 2 female
NUM_INFERRED_GENDERS = 2  # 0 male, 1 female (with a confidence score)
NUM_AGE_BRACKETS = 10  # num_age_brackets; 0 unknown
# The lower bounds of the brackets 1.. (``age_bracket``); the nano config leaves room for 10.
AGE_BRACKET_FLOORS = (13, 18, 25, 35, 45, 55, 65)
MAX_AGE_YEARS = 150.0


def age_bracket(age_years) -> np.ndarray:
    """The bracket (int32, 1..7) of ages in years; 0 where the age is unknown (0) or below the
    first bracket."""
    age = np.asarray(age_years, np.float64)
    return np.searchsorted(np.array(AGE_BRACKET_FLOORS), age, side="right").astype(np.int32)


@dataclass(frozen=True)
class Feature:
    """One feature: its name (the production family's input name), kind, inclusive range and
    width (0: one value; for ``apps``, the number of apps a set is drawn from)."""

    name: str
    kind: str  # "int", "float", "time" (Unix seconds, 0 unknown) or "apps" (a set of indices)
    low: float
    high: float
    width: int = 0
    about: str = ""

    @property
    def dtype(self) -> np.dtype:
        kinds = {"int": np.int32, "float": np.float32, "time": np.int64, "apps": np.bool_}
        return np.dtype(kinds[self.kind])


PROFILE_FEATURES: tuple[Feature, ...] = (
    Feature("country", "int", 0, NUM_COUNTRIES - 1, about="0 unknown"),
    Feature("language", "int", 0, NUM_LANGUAGES - 1, about="0 unknown"),
    Feature("latitude", "float", -90.0, 90.0, about="degrees"),
    Feature("longitude", "float", -180.0, 180.0, about="degrees"),
    Feature(
        "installed_apps",
        "apps",
        0,
        NUM_INSTALLED_APPS - 1,
        NUM_INSTALLED_APPS,
        "the indices of the apps installed",
    ),  # fmt: skip
    Feature("profile_gender", "int", 0, NUM_PROFILE_GENDERS - 1, about="0 not given"),
    Feature("inferred_gender", "int", 0, NUM_INFERRED_GENDERS - 1),
    Feature("inferred_gender_score", "float", 0.0, 1.0, about="the inference's confidence"),
    Feature("age_bracket", "int", 0, NUM_AGE_BRACKETS - 1, about="0 unknown"),
    Feature("age_years", "float", 0.0, MAX_AGE_YEARS, about="0 unknown"),
    Feature("timezone", "int", 0, NUM_TIMEZONES - 1, about="the home timezone, 0 unknown"),
)
PROFILE_NAMES = tuple(f.name for f in PROFILE_FEATURES)

HISTORY_FEATURES: tuple[Feature, ...] = (
    Feature("product_surface", "int", 0, NUM_PRODUCT_SURFACES - 1),
    Feature("impression_time", "time", 0, 2**63 - 1, about="Unix seconds"),
    Feature("creation_time", "time", 0, 2**63 - 1, about="the post's, Unix seconds, 0 unknown"),
    Feature("timezone", "int", 0, NUM_TIMEZONES - 1, about="the viewer's, 0 unknown"),
    Feature("hour_of_day", "int", 0, NUM_HOURS_OF_DAY - 1, about="local hour + 1, 0 unknown"),
    Feature("dwell_time", "float", 0.0, float(np.finfo(np.float32).max), about="seconds"),
    Feature("semantic_ids", "int", 0, SID_CODEBOOK_SIZE, SID_NUM_LEVELS, "0 missing"),
)
HISTORY_NAMES = tuple(f.name for f in HISTORY_FEATURES)


def feature(name: str, features: tuple[Feature, ...] = PROFILE_FEATURES) -> Feature:
    """The feature called ``name`` among ``features``."""
    for f in features:
        if f.name == name:
            return f
    raise KeyError(f"no feature {name!r}; expected one of {[f.name for f in features]}")


# -- X's action slots -----------------------------------------------------------------------

# The production ranker's 64 action slots (its history's action flags and its predicted
# probabilities), slot i for X's action number i (its ActionName enum; the nano config rounds
# its 60 actions up to 64). A slot that holds one of the feed's actions (phoenix.config's
# ACTION_NAMES: favorite, reply, ...) takes that name, so a blend or a policy written for the
# feed's actions reads the same columns; every other slot is X's name, lowercase.
# dwell_time has no slot: X predicts it with a continuous head, not a probability.
ACTION_SLOTS: tuple[str, ...] = (
    "invalid_name",                                # 0: never a label
    "favorite",                                    # SERVER_TWEET_FAV
    "server_tweet_unfav",
    "server_tweet_create",
    "reply",                                       # SERVER_TWEET_REPLY
    "quote",                                       # SERVER_TWEET_QUOTE
    "repost",                                      # SERVER_TWEET_RETWEET
    "server_tweet_unreply",
    "server_tweet_unquote",
    "server_tweet_unretweet",
    "server_tweet_report",                         # 10
    "dwell",                                       # CLIENT_TWEET_RECAP_DWELLED
    "client_tweet_recap_not_dwelled",
    "vqv",                                         # CLIENT_TWEET_VIDEO_QUALITY_VIEW
    "photo_expand",                                # CLIENT_TWEET_PHOTO_EXPAND
    "client_tweet_click_mention_screen_name",
    "report",                                      # CLIENT_TWEET_REPORT
    "not_interested",                              # CLIENT_TWEET_NOT_INTERESTED_IN
    "client_tweet_undo_not_interested_in",
    "client_tweet_see_fewer",
    "client_tweet_undo_see_fewer",                 # 20
    "follow_author",                               # CLIENT_TWEET_FOLLOW_AUTHOR
    "client_tweet_unfollow_author",
    "block_author",                                # CLIENT_TWEET_BLOCK_AUTHOR
    "client_tweet_unblock_author",
    "mute_author",                                 # CLIENT_TWEET_MUTE_AUTHOR
    "client_tweet_unmute_author",
    "client_tweet_mute_conversation",
    "client_tweet_unmute_conversation",
    "click",                                       # CLIENT_TWEET_CLICK
    "profile_click",                               # 30: CLIENT_TWEET_CLICK_PROFILE
    "client_tweet_click_share",
    "share_via_copy_link",                         # CLIENT_TWEET_SHARE_VIA_COPY_LINK
    "share_via_dm",                                # CLIENT_TWEET_CLICK_SEND_VIA_DIRECT_MESSAGE
    "client_tweet_unbookmark",
    "client_tweet_click_hashtag",
    "client_tweet_bookmark",
    "share",                                       # CLIENT_TWEET_SHARE
    "quoted_click",                                # CLIENT_QUOTED_TWEET_CLICK
    "client_tweet_open_link",
    "client_tweet_take_screenshot",                # 40
    "client_tweet_translate_click",
    "client_tweet_not_relevant",
    "client_tweet_undo_not_relevant",
    "client_card_click",
    "client_tweet_show_more_expand",
    "client_tweet_click_grok_analyze",
    "client_tweet_video_open",
    "client_quoted_tweet_video_quality_view",
    "client_quoted_tweet_photo_expand",
    "client_notification_open",                    # 50
    "client_notification_click",
    "client_notification_see_less_often",
    "client_notification_dismiss",
    "client_app_enter",
    "client_app_exit",
    "client_notification_impression",
    "client_profile_click",
    "client_notification_sent",
    "server_tweet_post_unexplored",
    "client_tweet_external_link_long_dwelled",     # 60
    "server_profile_follow",
    "server_profile_unfollow",
    "server_profile_block",
)  # fmt: skip
NUM_ACTION_SLOTS = len(ACTION_SLOTS)
