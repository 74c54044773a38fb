"""Heal dead models and tell a load balancer the truth about readiness: Triton 2.51 restarts no
dead stub and keeps answering ready (docs/reliability.md). `stubs`, the registry, is imported by
every stub, so this package imports nothing; `admin` is Triton's admin API, `state` the state
machine, `endpoints` /ready, /live and /status."""
