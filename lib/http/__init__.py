"""The worker's HTTP side: the server, /metrics, the health endpoints and
the admin page."""
