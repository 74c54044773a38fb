"""Heal dead models and tell a load balancer the truth about readiness (docs/reliability.md).

Triton 2.51 does not restart a model's dead stub, and its own health endpoints keep answering
200. `serve` runs the supervisor beside its server: `stubs` (imported by every stub, so this
package imports nothing heavy) is the stub registry, `admin` Triton's admin API, `state` the
state machine and `endpoints` /ready, /live and /status.
"""
