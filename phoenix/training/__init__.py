"""Training both Phoenix towers on synthetic engagement logs, and their offline evaluation.

- ``synthetic``: the log generator (a planted ground-truth model; numpy only);
- ``logs``: the log files' schema, writer and reader;
- ``data``: requests in the served input layout from the logs (numpy only);
- ``train``: losses and jitted optax train steps (jax, haiku, optax);
- ``evaluate``: recall@k, per-action AUC, NDCG@20 against baselines (jax, numpy);
- ``presets``, ``pipeline``, ``report``, ``cli``: presets, file I/O and the command line
  (``python -m phoenix.training --help``).
"""
