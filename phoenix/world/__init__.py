"""A synthetic world with a planted structure: users, authors and posts (``synthetic``), how a
user reacts to a post (``reactions``), its logs on disk (``logs``), simulated users who react
to served feeds (``simulate``), its users as user-state events (``users``), which users ask
how often (``popularity``), and what X's production ranker reads beside: posts' semantic IDs
and users' profiles (``features``). Demonstrations, training and benchmarks run on it.

May import the model layer, the checkpoint, the artifacts (the trained world's), the user state
and the corpus store.
"""
