"""gevent helpers with no knowledge of jobs: supervised parts, timers with
deadlines, greenlets that stay for the next ask, and the watch that says
when something holds the hub."""
