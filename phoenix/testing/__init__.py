"""The harness the tests and the benchmarks share (imported by module; nothing here imports
more than the standard library, so `python -m phoenix.testing.<module>` stays cheap):

- polling: ``wait_until`` a condition holds, with a bound;
- processes: a command in a session of its own, output to a log file, stopped as a group;
- serve: the serve command (``python -m phoenix.serving.serve``) on free loopback ports;
- triton: a bare tritonserver on free loopback ports;
- proxy: nginx in front of serve replicas (HTTP and gRPC, round-robin, graceful reloads);
- loadgen: an open- or closed-loop tritonclient load that records every request;
- locust: the project's locustfile run in the background, and its CSV files read back;
- memory: resident (RSS) and proportional (PSS) memory of processes.
"""
