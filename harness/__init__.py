"""The harness the tests and the benchmarks share (imported by module; this package file
imports only pathlib, for REPO_ROOT, so each module costs only its own imports):

- polling: ``wait_until`` a condition holds, with a bound;
- serve_process: the serve command (``python -m phoenix.ops.serve``) on free loopback
  ports, waited for until ready, stopped with SIGTERM, its group killed past the bound
  (a ``phoenix.util.processes.LoggedProcess``);
- triton: a bare tritonserver on free loopback ports;
- proxy: nginx in front of serve replicas (HTTP and gRPC, round-robin, graceful reloads);
- loadgen: an open- or closed-loop tritonclient load that records every request;
- locust_runs: the project's locustfile run in the background, and its CSV files read back;
- memory: resident (RSS) and proportional (PSS) memory of processes;
- machine: what a benchmark ran on, and the device it asked for required of JAX;
- results: a benchmark's figures written as JSON;
- perf_analyzer: Triton's perf_analyzer taken out of the tritonclient 2.51 wheel;
- gpu_payload, gpu_machine: what a bare GPU machine lacks, packed here and set up there.
- gpu_bench: the GPU benchmark's profiles, its steps' commands, the command and machine
  stamped on its results, and the docs section rendered from them (bench/gpu runs the steps);
- bench_options: the production benchmarks' command lines parsed (bench_production,
  bench_prefix_cache, bench_xrex) and what bench_production serves; production_report: its
  summary and table; call_timing: calls timed as the xrex step times both forwards;
- xrex_release, xrex_imports: X's release packed for a device, and made importable in the
  process that runs X's own forward;
- serving_rows: rows of bench_serving's results picked and compared;
- serving_repository: bench_serving's workloads, the repositories it serves (the ranker's
  cache off) and the models whose programs its servers run.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout this harness runs from
