"""Training both Phoenix towers on engagement logs (the synthetic world's,
``phoenix.world``, or served ones), and their offline evaluation.

- ``data``: requests in the served input layout from the logs (numpy only);
- ``train``: losses and jitted optax train steps (jax, haiku, optax);
- ``evaluate``: recall@k, per-action AUC, NDCG@20 against baselines (jax, numpy);
- ``presets``, ``pipeline``, ``report``, ``cli``: presets, file I/O and the command line
  (``python -m phoenix.training --help``).

May import the synthetic world, the user state, the artifacts, the engine, the schema, the
checkpoint, the model layer and ``phoenix.util``; never the stub side or the operations (the
loop demo, which drives a server, is its own entry point).
"""
