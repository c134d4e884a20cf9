"""gevent helpers with no knowledge of jobs: supervised parts, timers with
deadlines, greenlets that stay for the next ask, retry backoff, and the
watch that says when something holds the hub."""
