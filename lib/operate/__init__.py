"""What an operator runs: the command line, its commands (status, failed,
redrive, pause, check), the overview of every worker, and the checks the
worker makes of its registry and schedule before it starts."""
