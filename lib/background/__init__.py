"""The parts a worker runs beside its pollers: leases (the fence and the
rescue of expired ones), the clock that enqueues scheduled jobs, the worker
registry, and the declaration of dedupe names."""
