-- jobs_dedupe_declare's LOCK TABLE jobs waits for every open transaction
-- that wrote jobs (an application's, which may stay open for long), and while
-- it waits each other session's write to jobs queues behind it: running
-- workers' heartbeats, rescues and outcomes. With a short lock_timeout it
-- gives up instead (lock_not_available, 55P03) and its caller tries again
-- later (lib/background/dedupe.py), so they wait for a moment at most. The same bound
-- holds for the row locks its marking waits for while it holds jobs locked.
-- A clause of the function: it holds for the function's statements alone,
-- never for the rest of the caller's transaction.
ALTER FUNCTION jobs_dedupe_declare(text, text[]) SET lock_timeout = '100ms';
