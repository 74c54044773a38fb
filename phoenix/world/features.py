"""The synthetic world's features for X's production ranker: posts' semantic IDs and users'
profiles (numpy only). Each is drawn from a stream of its own (``phoenix.artifact_parts.stream``),
after everything else, so the world's other arrays are what they were without them; nothing
of the engagement model (``reactions``) reads them.

**Semantic IDs** (``SID_NUM_LEVELS`` codes in [1, ``SID_CODEBOOK_SIZE``] per post), coarse
to fine, as a residual quantizer of content embeddings would give them:

- level 0: the post's topic (one code per topic, distinct);
- level 1: its topic and media type (text, photo, video);
- level 2: its author (authors share codes by chance: 256 codes);
- level 3: its author and quality (8 quality buckets per author);
- levels 4-5: the post itself, so two posts rarely share all six.

So posts of one topic share a 1-code prefix, those of one topic and media a 2-code prefix,
one author's a 3-code prefix within a topic and media.

**Profiles** (``feed_features.PROFILE_FEATURES``): a home city (timezone, country, language,
location jittered around it; 3% unknown), gender as given (35% not given) and inferred, an
age (15% not given) and its bracket, and installed apps among 64. Two of them carry signal
about interests, as they do for real users: the age centres on a mean per primary topic, and
apps 0..T-1 are topic apps (a user installs their primary topic's with 50%, the secondary
one's with 30%) beside 48 general apps of Zipf-like popularity.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from phoenix.artifact_parts import stream
from phoenix.feed_features import (
    NUM_INSTALLED_APPS,
    PROFILE_FEATURES,
    SID_CODEBOOK_SIZE,
    SID_NUM_LEVELS,
    TIMEZONES,
    age_bracket,
)

COUNTRY_NAMES = (
    "unknown", "US", "BR", "GB", "FR", "DE", "ES", "IT", "NL", "TR", "RU", "JP", "IN", "CN",
    "KR", "ID", "TH", "AE", "SA", "PH", "SG", "AU", "CA", "MX", "AR", "NG",
)  # fmt: skip
LANGUAGE_NAMES = (
    "unknown", "en", "pt", "fr", "de", "es", "it", "nl", "tr", "ru", "ja", "hi", "zh", "ko",
    "id", "th", "ar", "tl",
)  # fmt: skip
ENGLISH = LANGUAGE_NAMES.index("en")
# The users' home cities: (timezone bucket's name, country, language, latitude, longitude,
# share of users), one per timezone bucket 1..30 of feed_features.TIMEZONES.
CITIES = (
    ("America/New_York", "US", "en", 40.7, -74.0, 8),
    ("America/Chicago", "US", "en", 41.9, -87.6, 5),
    ("America/Los_Angeles", "US", "en", 34.1, -118.2, 6),
    ("America/Denver", "US", "en", 39.7, -105.0, 2),
    ("America/Sao_Paulo", "BR", "pt", -23.6, -46.6, 6),
    ("Europe/London", "GB", "en", 51.5, -0.1, 6),
    ("Europe/Paris", "FR", "fr", 48.9, 2.4, 4),
    ("Europe/Berlin", "DE", "de", 52.5, 13.4, 4),
    ("Europe/Madrid", "ES", "es", 40.4, -3.7, 3),
    ("Europe/Rome", "IT", "it", 41.9, 12.5, 3),
    ("Europe/Amsterdam", "NL", "nl", 52.4, 4.9, 1),
    ("Europe/Istanbul", "TR", "tr", 41.0, 29.0, 4),
    ("Europe/Moscow", "RU", "ru", 55.8, 37.6, 2),
    ("Asia/Tokyo", "JP", "ja", 35.7, 139.7, 8),
    ("Asia/Kolkata", "IN", "hi", 22.6, 88.4, 7),
    ("Asia/Shanghai", "CN", "zh", 31.2, 121.5, 1),
    ("Asia/Seoul", "KR", "ko", 37.6, 127.0, 2),
    ("Asia/Jakarta", "ID", "id", -6.2, 106.8, 4),
    ("Asia/Bangkok", "TH", "th", 13.8, 100.5, 2),
    ("Asia/Dubai", "AE", "ar", 25.2, 55.3, 1),
    ("Asia/Riyadh", "SA", "ar", 24.7, 46.7, 3),
    ("Asia/Manila", "PH", "tl", 14.6, 121.0, 3),
    ("Asia/Singapore", "SG", "en", 1.35, 103.8, 1),
    ("Australia/Sydney", "AU", "en", -33.9, 151.2, 2),
    ("Pacific/Honolulu", "US", "en", 21.3, -157.9, 1),
    ("America/Phoenix", "US", "en", 33.4, -112.1, 1),
    ("America/Toronto", "CA", "en", 43.7, -79.4, 2),
    ("America/Mexico_City", "MX", "es", 19.4, -99.1, 4),
    ("America/Argentina/Buenos_Aires", "AR", "es", -34.6, -58.4, 2),
    ("Africa/Lagos", "NG", "en", 6.5, 3.4, 2),
)
UNKNOWN_HOME = 0.03  # users whose timezone, country, language and location are unknown
NO_GENDER, NO_AGE = 0.35, 0.15  # users who give no gender, no age
TOPIC_APP, SECOND_TOPIC_APP = 0.5, 0.3  # chance a user has their topics' apps
QUALITY_BUCKETS = 8  # semantic-ID level 3: buckets of post quality per author


@dataclass
class UserProfiles:
    """Every user's profile, index-aligned with the world's users; fields named as
    ``feed_features.PROFILE_FEATURES`` (their dtypes: ``Feature.dtype``)."""

    country: np.ndarray  # int32 [U]
    language: np.ndarray  # int32 [U]
    latitude: np.ndarray  # float32 [U]
    longitude: np.ndarray  # float32 [U]
    installed_apps: np.ndarray  # bool [U, 64]
    profile_gender: np.ndarray  # int32 [U]
    inferred_gender: np.ndarray  # int32 [U]
    inferred_gender_score: np.ndarray  # float32 [U]
    age_bracket: np.ndarray  # int32 [U]
    age_years: np.ndarray  # float32 [U]
    timezone: np.ndarray  # int32 [U] the home timezone

    def __len__(self) -> int:
        return int(self.country.shape[0])

    @classmethod
    def unknown(cls, users: int) -> UserProfiles:
        """``users`` profiles with nothing known (every value 0)."""
        return cls(**{f.name: np.zeros((users, f.width) if f.width else users, f.dtype)
                      for f in PROFILE_FEATURES})  # fmt: skip

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def take(self, rows) -> UserProfiles:
        return UserProfiles(**{name: array[rows] for name, array in self.arrays().items()})


def draw_semantic_ids(
    seed: int,
    num_topics: int,
    post_topic: np.ndarray,
    post_media: np.ndarray,
    post_author: np.ndarray,
    post_quality: np.ndarray,
    num_authors: int,
) -> np.ndarray:
    """int32 [P, SID_NUM_LEVELS]: every post's semantic ID (module docstring), codes 1..256."""
    rng = stream(seed, "semantic-ids")
    codes = SID_CODEBOOK_SIZE
    topic_code = 1 + rng.permutation(codes)[:num_topics]  # [T] distinct
    media_code = rng.integers(1, codes + 1, (num_topics, 3))  # [T, media]
    author_code = rng.integers(1, codes + 1, num_authors)  # [A]
    quality_code = rng.integers(1, codes + 1, (num_authors, QUALITY_BUCKETS))  # [A, buckets]
    post_code = rng.integers(1, codes + 1, (len(post_topic), SID_NUM_LEVELS - 4))  # [P, 2]
    # a post's quality bucket among all posts' (quantiles of the quality's normal)
    edges = np.quantile(post_quality, np.linspace(0, 1, QUALITY_BUCKETS + 1)[1:-1])
    bucket = np.searchsorted(edges, post_quality)  # [P] 0..7
    sids = np.stack(
        [
            topic_code[post_topic],
            media_code[post_topic, post_media],
            author_code[post_author],
            quality_code[post_author, bucket],
        ],
        axis=1,
    )  # [P, 4]
    return np.concatenate([sids, post_code], axis=1).astype(np.int32)


def draw_profiles(seed: int, interest: np.ndarray) -> UserProfiles:
    """Every user's profile (module docstring); ``interest`` [U, T] is the world's (1.0 for
    the primary topic, 0.6 for a secondary one)."""
    rng = stream(seed, "profiles")
    users, topics = interest.shape
    # home: a city, or nothing known
    shares = np.array([c[5] for c in CITIES], np.float64)
    city = rng.choice(len(CITIES), users, p=shares / shares.sum())
    known = rng.random(users) >= UNKNOWN_HOME
    zone_of = {name: i for i, (name, _) in enumerate(TIMEZONES)}
    column = lambda i: np.array([c[i] for c in CITIES])  # noqa: E731
    timezone = np.array([zone_of[c[0]] for c in CITIES])[city]
    country = np.array([COUNTRY_NAMES.index(c[1]) for c in CITIES])[city]
    language = np.array([LANGUAGE_NAMES.index(c[2]) for c in CITIES])[city]
    language = np.where(rng.random(users) < 0.2, ENGLISH, language)  # a second language
    latitude = column(3)[city] + rng.normal(0.0, 1.5, users)
    longitude = column(4)[city] + rng.normal(0.0, 1.5, users)
    # gender as given, and as inferred (with a confidence)
    given = np.asarray(
        rng.choice(3, users, p=[NO_GENDER, (1 - NO_GENDER) / 2, (1 - NO_GENDER) / 2])
    )
    guessed = rng.integers(0, 2, users)
    right = rng.random(users) < 0.9
    inferred = np.where(given > 0, np.where(right, given - 1, 2 - given), guessed)
    score = np.where(given > 0, rng.uniform(0.6, 1.0, users), rng.uniform(0.5, 1.0, users))
    # age: centred on a mean of the user's primary topic
    primary = interest.argmax(axis=1)
    topic_age = np.asarray(rng.uniform(22.0, 48.0, topics))  # [T]
    age = np.clip(np.round(rng.normal(topic_age[primary], 9.0)), 13, 90)
    age = np.where(rng.random(users) < NO_AGE, 0.0, age)
    apps = _installed_apps(rng, interest)
    return UserProfiles(
        country=np.where(known, country, 0).astype(np.int32),
        language=np.where(known, language, 0).astype(np.int32),
        latitude=np.where(known, np.clip(latitude, -90, 90), 0).astype(np.float32),
        longitude=np.where(known, np.clip(longitude, -180, 180), 0).astype(np.float32),
        installed_apps=apps,
        profile_gender=given.astype(np.int32),
        inferred_gender=inferred.astype(np.int32),
        inferred_gender_score=np.round(score, 3).astype(np.float32),
        age_bracket=age_bracket(age),
        age_years=age.astype(np.float32),
        timezone=np.where(known, timezone, 0).astype(np.int32),
    )


def _installed_apps(rng: np.random.Generator, interest: np.ndarray) -> np.ndarray:
    """bool [U, 64]: the topic apps of a user's topics (by chance), and general apps by
    popularity (the i-th general app with chance 0.6 (i + 1)^-0.7: 4.7 apps a user)."""
    users, topics = interest.shape
    general = NUM_INSTALLED_APPS - topics
    chance = 0.6 * (np.arange(general) + 1.0) ** -0.7  # [G]
    apps = np.zeros((users, NUM_INSTALLED_APPS), bool)
    apps[:, topics:] = rng.random((users, general)) < chance
    draw = rng.random((users, topics))  # [U, T]
    wanted = np.where(interest >= 1.0, TOPIC_APP, np.where(interest > 0, SECOND_TOPIC_APP, 0.0))
    apps[:, :topics] = draw < wanted
    return apps
