"""Which service answers each served model, and building one from its settings.

Each service's module is imported when that model's service is asked for (the imports below sit
in the branches on purpose): a stub of a host-only model (user state, feed policy, served log)
never imports JAX, and a stub's JAX environment is set before JAX is imported
(``triton_adapter.configure_jax_environment``). A host-only stub starts in 0.3-0.4 CPU-s where
it took 1.2 with every service imported (docs/serving.md, "Tests against a real server").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phoenix.schema.contracts import (
    CANDIDATE_TOWER,
    FEED_POLICY,
    RANKER,
    RETRIEVER,
    SERVED_LOG,
    STAGE_MODELS,
    USER_ENCODER,
    USER_STATE,
)
from phoenix.schema.recommend import RECOMMEND_CHAIN

if TYPE_CHECKING:
    from phoenix.stub.services.common import Service, ServiceSettings

# Every model a service answers: recommend's stages in the chain's order, then the chain.
SERVED_BY_SERVICES = (*(c.name for c in STAGE_MODELS), RECOMMEND_CHAIN.name)


def service_class(model: str) -> type[Service]:
    """The service class of ``model``; ValueError naming the served ones when it has none."""
    if model in (USER_ENCODER.name, CANDIDATE_TOWER.name, RETRIEVER.name):  # the two towers
        from phoenix.stub.services import retrieval

        towers = {
            USER_ENCODER.name: retrieval.UserEncoderService,
            CANDIDATE_TOWER.name: retrieval.CandidateTowerService,
            RETRIEVER.name: retrieval.RetrieverService,
        }
        return towers[model]
    if model == RANKER.name:
        from phoenix.stub.services.ranker import RankerService

        return RankerService
    if model == RECOMMEND_CHAIN.name:
        from phoenix.stub.services.recommend import RecommendChainService

        return RecommendChainService
    # the host-only models: their stubs never import JAX
    if model == USER_STATE.name:
        from phoenix.stub.services.user_state import UserStateService

        return UserStateService
    if model == FEED_POLICY.name:
        from phoenix.stub.services.feed_policy import FeedPolicyService as policy

        return policy
    if model == SERVED_LOG.name:
        from phoenix.stub.services import served_log

        return served_log.ServedLogService
    raise ValueError(f"no service for model {model!r}; served: {sorted(SERVED_BY_SERVICES)}")


def build_service(settings: ServiceSettings) -> Service:
    """The service of ``settings.model``, built from its settings."""
    if settings.model == RECOMMEND_CHAIN.name:
        return build_chain(settings)
    if settings.model == RANKER.name and is_production_family(settings.artifact_dir):
        from phoenix.stub.services.production_ranker import ProductionRankerService

        return ProductionRankerService.from_settings(settings)
    return service_class(settings.model).from_settings(settings)


def is_production_family(artifact_dir) -> bool:
    """The artifacts' ranker is X's production ranker (their config.json says so)."""
    from phoenix.checkpoint import load_config

    return load_config(artifact_dir).ranker_family == "production"


def build_chain(settings: ServiceSettings) -> Service:
    """recommend_chain: every stage's service built here, from the chain's settings, over one
    copy of the weights and tables."""
    from phoenix.stub.services.recommend import RecommendChainService, stage_settings
    from phoenix.stub.services.resources import load_shared

    load_shared(settings.artifact_dir)  # one copy of the weights and tables for every stage
    services = {
        stage.model: build_service(stage_settings(settings, stage.model))
        for stage in RECOMMEND_CHAIN.stages
    }
    return RecommendChainService(services, max_batch_size=settings.max_batch_size)
