"""The whole loop in one command (``python -m phoenix.loop``, ``make loop``;
docs/loop.md): a version 1 with room to improve is served to simulated world users, their
engagements train version 2, which is gated offline and rolled out under load, and the users'
online metrics of both versions are compared with per-user intervals.

Steps (each announced on stdout with the clock time and the seconds since the start):

1. **v1**: the preset (demo) trained with few steps (``--v1-retrieval-steps``,
   ``--v1-ranker-steps``): an undertrained model that has room to improve;
2. **serve v1**: a redis-server child, ``phoenix.ops.serve --redis`` over it, the simulated
   users' state loaded from the world (their newest ``--history-keep`` engagements);
3. **users on v1**: reacting Locust users (``loadtest/reacting.py``) for ``--minutes``,
   metrics labelled ``v1``;
4. **v2**: the served logs exported (``served_export``), version 2 trained warm from v1
   (``retrain``) with its offline gate (``gate.json``);
5. **rollout under load**: when the gate passed (or ``--force``), reacting users (label
   ``rollout``) run through the rollout (shadow, switch, unload; ``phoenix.ops.rollout``)
   and their failed requests are counted; when it failed, nothing is rolled out;
6. **the second phase**: ``--minutes`` more on v2 (label ``v2``), or on v1 again when v2 was
   not rolled out (label ``v1-again``: an A/A comparison), the posts marked served to the
   users unmarked first (``forget_served``) so both phases start from the same corpus;
7. **report**: the outcome in words, the phases compared with per-user bootstrap intervals
   (``compare``), the rollout window and timeline, the gate: JSON, PNG and markdown
   (``report``).

Modules: ``options`` (LoopOptions, Progress, LoopError), ``processes`` (redis, serve, Locust),
``compare`` (the statistics), ``report`` (the outputs), ``run`` (the steps), ``cli``.
Everything started here dies with the loop (``phoenix.util.processes``), also when it is killed.

The top of the house: may import every package below it (operations, training, the world,
the clients); nothing imports it.
"""

from phoenix.loop.cli import add_arguments, main_from_args
from phoenix.loop.options import LoopError, LoopOptions

__all__ = ["LoopError", "LoopOptions", "add_arguments", "main_from_args"]
