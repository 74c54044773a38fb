"""What the served models take and answer, written once: the spec language (``spec``), every
model's contract (``contracts``), the production family's inputs beside ids
(``production_inputs``), recommend's wiring (``recommend``), every served model by name
(``served``), the typed requests (``request_types``, written from the contracts) and their
checks (``requests``), padded batches (``batches``) and the runner of wired steps
(``wiring``).

May import numpy, tritonclient's dtype helper and the model layer (``phoenix.config``,
``phoenix.feed_policy``'s filter names); nothing that runs a model, a server or a store.
"""
