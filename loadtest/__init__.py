"""The project's Locust load test: ``locustfile.py`` (Locust's users and wiring), the
requests it sends (``workload``), the check of every answer (``checks``), closing gRPC
clients off the loop (``grpc_pool``), the runner behind
`make loadtest` (``runner``) and the reacting world users of the loop (``reacting.py``).

May import phoenix, clients and harness; nothing in the product imports it.
"""
