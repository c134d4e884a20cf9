"""The run pipeline: a queue's poller waits for work, claims the head of its
queue, runs the handler under the lease's fence and the job timeout, decides
the outcome, and hands it to the store to write."""
