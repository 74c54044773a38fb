"""Operating a server: serve (``serve``, the Triton process ``triton_server``, the backend
folder ``triton_install``), its supervisor (``supervisor``), the configs generated from the
contracts and the deployment profiles (``configs``, ``profiles``), the docs written from them
(``profile_docs``, ``reference_docs``), compiled programs (``compile``), reloads, rollouts,
the admin key, and the production ranker's check against X's reference data
(``check_reference``).

May import every layer below it: the schema, the stub side, the client side, the user state,
the corpus store, the checkpoint and the models.
"""
