"""What each served model does, free of Triton: requests in, outputs (or errors) out.

A service receives the inputs of every request of one Triton ``execute`` call, checks each
request on its own (a bad one gets an ``InputError``, the others are unaffected), stacks the
good ones into one padded batch, makes one engine call and splits the results per request
(``common.Service``).

- ``common``: settings, the artifacts an instance loads, the request loop.
- ``retrieval``: ``UserEncoderService``, ``CandidateTowerService``, ``RetrieverService``.
- ``ranker``: ``RankerService`` (the whole batch on the device) and its score weights.
- ``user_state``: ``UserStateService`` (histories and served posts from the user-state
  store by user id, or the request's own history passed on).
- ``feed_policy``: ``FeedPolicyService`` (filters, every action's weight, author diversity
  after the ranker; numpy only).
- ``served_log``: ``ServedLogService`` (the last step: the feed marked served, the request
  logged, a request id answered; a side effect that never fails the feed).

- ``resources``: ``PhoenixResources``, the artifacts and programs of the device services.

- ``recommend``: ``RecommendChainService`` (every stage of recommend in one process).
- ``catalog``: which service answers each model (``service_class``, ``build_service``), the
  one place the Triton adapter and the in-process models build a service from.

This file imports nothing: importing one service's module never imports the others (a
host-only stub never imports JAX).
"""
