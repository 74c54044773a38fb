"""Command-line clients of the served Phoenix models (run as `python -m clients.<name>`)."""
