-- The claims of a batch in two statements, whatever the number of queues,
-- instead of several statements a queue: one takes the queues' turns, one
-- claims for every queue whose turn it has. The rules are 014's (see
-- jobs_claim there); only their shape changes.

DROP FUNCTION jobs_claim(text, int[], text, float8, int, bigint);

-- Claim, for each (queue, worker) among the asks, up to one job per free slot
-- asked for, in the queue's order. One row per job claimed (slot set), and
-- one row of NULLs for each group that claimed nothing, whose wait says how
-- long until its queue may have work (NULL: not known; 0.05: look again
-- shortly, its turn or its head row is held this moment).
CREATE FUNCTION jobs_claim(
  c_queues text[], c_slots int[], c_workers text[], c_leases float8[], c_max_attempts int[], c_ids bigint[]
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  busy text[];
BEGIN
  -- Each queue's turn (jobs_queue_turn), never waited for: the queues whose
  -- turn another transaction holds now.
  SELECT array_agg(t.q) FILTER (WHERE NOT t.mine) INTO busy
  FROM (SELECT d.q, pg_try_advisory_xact_lock(1785684595, hashtext(d.q)) AS mine
        FROM (SELECT DISTINCT u.q FROM unnest(c_queues) u(q)) d) t;
  -- A statement after the locks: its snapshot holds what committed before them.
  RETURN QUERY
  WITH ask AS (
    SELECT c.q, c.s, c.w, c.l, c.m, c.i
    FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
  ),
  grp AS (
    SELECT a.q, a.w, a.l, a.m, a.i,
           a.q = ANY(coalesce(busy, '{}')) AS busy,
           (SELECT greatest(jq.paused_until, jq.next_claim_at) FROM job_queues jq WHERE jq.queue = a.q) AS gate,
           -- The database holds the queue to its concurrency: a slot number
           -- is free when no started row of the queue, of any process, holds it.
           array_agg(a.s ORDER BY a.s) FILTER (
             WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.queue = a.q AND j.status = 'started' AND j.slot = a.s)
           ) AS free
    FROM ask a
    GROUP BY a.q, a.w, a.l, a.m, a.i
  ),
  heads AS (
    SELECT g.q, g.w, g.l, g.m, g.free, h.id, h.n
    FROM grp g
    CROSS JOIN LATERAL (
      SELECT o.id, row_number() OVER (ORDER BY o.priority DESC, o.run_at, o.id)::int AS n
      FROM (SELECT j.id, j.priority, j.run_at FROM jobs j
            WHERE j.queue = g.q AND j.status = 'pending' AND j.run_at <= now()
              AND j.id = coalesce(g.i, j.id)  -- not an OR: that makes the generic plan look dear
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT cardinality(g.free)) o
    ) h
    WHERE NOT g.busy AND g.free IS NOT NULL AND NOT coalesce(g.gate > now(), false)
  ),
  locked AS (
    SELECT j.id FROM jobs j
    WHERE j.id IN (SELECT heads.id FROM heads) AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
  ),
  picked AS (
    -- The prefix of each queue's order that could be locked: never job n+1
    -- while job n is due and not started.
    SELECT h.* FROM heads h
    WHERE NOT EXISTS (SELECT 1 FROM heads e
                      WHERE e.q = h.q AND e.w = h.w AND e.n <= h.n
                        AND NOT EXISTS (SELECT 1 FROM locked k WHERE k.id = e.id))
  ),
  claimed AS (
    UPDATE jobs j
    SET status = 'started', started_at = now(), finished_at = NULL,
        attempts = j.attempts + 1,
        max_attempts = coalesce(j.max_attempts, p.m),
        worker_id = p.w, slot = p.free[p.n],
        -- From the moment of the claim, not the transaction's start.
        lease_until = clock_timestamp() + make_interval(secs => p.l)
    FROM picked p
    WHERE j.id = p.id
    -- args as text: decoded by the worker, which can end a row whose args it cannot read.
    RETURNING p.q, p.w, j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
              greatest(extract(EPOCH FROM now() - j.run_at), 0)::float8, NULL::float8, p.free[p.n]
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT g.q, g.w, NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::float8,
         CASE
           WHEN g.busy THEN 0.05::float8
           -- a pause may be infinite
           WHEN g.gate > now() THEN extract(EPOCH FROM least(g.gate, now() + interval '1 day') - now())::float8
           WHEN g.free IS NULL THEN NULL::float8  -- every slot asked for is taken
           WHEN EXISTS (SELECT 1 FROM heads h WHERE h.q = g.q AND h.w = g.w) THEN 0.05::float8  -- its head is held
           ELSE extract(EPOCH FROM (SELECT min(j.run_at) FROM jobs j
                                    WHERE j.queue = g.q AND j.status = 'pending' AND j.run_at > now()) - now())::float8
         END,
         NULL::int
  FROM grp g
  WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.q = g.q AND c.w = g.w);
END
$$;

CREATE OR REPLACE FUNCTION jobs_step(
  o_ids bigint[], o_workers text[], o_attempts int[], o_statuses text[], o_retry_ins float8[],
  o_last_errors text[], o_tracebacks text[], o_delays float8[], o_uncounted int[],
  c_queues text[], c_slots int[], c_workers text[], c_leases float8[], c_max_attempts int[], c_ids bigint[]
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
  -- The outcomes first, freeing their slots for the claims. The tests of
  -- cardinality are expressions, not queries: they cost next to nothing.
  IF cardinality(o_ids) > 0 THEN
    RETURN QUERY
    SELECT NULL::text, NULL::text, f.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, NULL::float8, NULL::int
    FROM jobs_finalize(o_ids, o_workers, o_attempts, o_statuses, o_retry_ins, o_last_errors,
                       o_tracebacks, o_delays, o_uncounted) f;
  END IF;
  IF cardinality(c_queues) > 0 THEN
    RETURN QUERY SELECT * FROM jobs_claim(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids);
  END IF;
END
$$;
