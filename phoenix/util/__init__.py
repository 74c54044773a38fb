"""Helpers every layer may use: command lines, child processes, machine paths, time bounds,
JSON lines.

Imports the standard library only, so any layer (the models' stubs included) imports them at
no cost.
"""
