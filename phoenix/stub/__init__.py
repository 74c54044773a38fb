"""The code that runs inside Triton's Python stubs: the adapter between Triton's tensors and
the services (``triton_adapter``), what each served model does (``services``), the corpus a
model reads (``corpus``), their metrics (``request_metrics``), the stub registry the
supervisor reads (``registry``) and the optional profile (``profile``).

May import the schema, the engine, the corpus store, the user state, the checkpoint and the
model layer; never the operations or the client side.
"""
