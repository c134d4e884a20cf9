"""The store: the only code that knows psycopg2. The pool and its driver
errors, the named statements of sql/, migrations, the group commit that
writes claims and outcomes, LISTEN/NOTIFY wakeups, the fork guard, and the
backoff of retries against the database."""
