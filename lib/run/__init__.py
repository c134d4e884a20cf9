"""The run pipeline, called in order by the poller's loop (poller.py): claim
the head of the queue (steps.py), run the handler under the lease's fence
and the job timeout and decide what its row stores (execute.py), and write
that outcome, with the slot's next claim, in the process's group commit
(steps.py again: the claim, the write and the batch they go in are one step
client). A queue's definition is a Queue (queue.py), plain data, whose rate
and budgets the worker declares at start (rates.py); what the pollers of a
worker share is its Runtime (runtime.py)."""
