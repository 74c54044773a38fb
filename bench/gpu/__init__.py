"""The GPU benchmark: its measuring steps (the payload and the machine's set-up they need are
harness/gpu_payload.py and gpu_machine.py).

How to set a machine up and run them: docs/gpu.md.
"""
