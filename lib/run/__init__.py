"""The run pipeline, one module per stage, called in order by the poller's
loop (poller.py): claim the head of the queue (claim.py), run the handler
under the lease's fence and the job timeout (execute.py), decide the outcome
(outcome.py), and hand it to the process's group commit to write (write.py;
the Committer of lib/store/group_commit.py).
A queue's definition is a Queue (queue.py), plain data, whose rate and
budgets the worker declares at start (rates.py); what the pollers of a
worker share is its Runtime (runtime.py)."""
