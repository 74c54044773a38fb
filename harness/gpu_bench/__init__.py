"""What the GPU benchmark (bench/gpu) measures and how its results are kept, shared by the
benchmark's steps and the tests: the profiles (sizes and points per device), each step's
command (steps), the command and machine stamped on each result file, and the docs section
rendered from them.

May import phoenix.util and harness; never bench (bench imports this).
"""
