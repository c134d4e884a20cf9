"""What a process needs before it works: settings and their secrets,
logging, error reporting, the counters /metrics reads, the embedded
PostgreSQL server, and a plain connection for synchronous programs."""
