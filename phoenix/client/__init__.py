"""The client side of a server: tritonclient requests built from the contracts (``client``),
the same services run in this process as a reference (``inprocess``), which artifacts a server
serves (``served_artifacts``), the server's candidate tower for the corpus tools
(``served_tower``) and ranking comparisons (``rank_agreement``).

May import the schema, the stub side (the in-process reference builds its services), the
engine (this process' candidate tower), the corpus store and the checkpoint; never the
operations.
"""
