"""The GPU benchmark: payload, machine set-up and measuring steps.

See the README, "Measuring on a GPU machine".
"""
