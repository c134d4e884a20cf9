"""Integrations with where applications already are: a web framework's own
way to enqueue work, run by this worker. Each module imports its framework
only when it is used, and the modules an application imports import nothing
of the worker's engine (no gevent, no pool)."""
