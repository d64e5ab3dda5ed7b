"""Example programs built on the clients; `python -m examples.agent` runs the example agent."""
