-- Order per key (lib/insert.py's key=): the jobs of one key in one queue
-- start one at a time, in the queue's order, across every process; jobs of
-- different keys run at once up to the queue's concurrency, and a job with no
-- key is claimed as before. "One job at a time per repository, many
-- repositories at once".

ALTER TABLE jobs ADD COLUMN key text;

-- The database's own guard: at most one started job per queue and key. The
-- claim never meets it (it picks no job whose key is started, under the
-- queue's turn); a writer by hand would.
CREATE UNIQUE INDEX jobs_key_started ON jobs (queue, key) WHERE status = 'started' AND key IS NOT NULL;

-- A claim's look for a started or earlier due job of a key, in the claim's order.
CREATE INDEX jobs_key_pending ON jobs (queue, key, priority DESC, run_at, id)
  WHERE status = 'pending' AND key IS NOT NULL;

-- Whether a due job of key k is its key's turn: no job of the key is started,
-- and none is due before it in the queue's order (priority, run_at, id).
CREATE FUNCTION jobs_key_turn(q text, k text, p int, r timestamptz, i bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT NOT EXISTS (SELECT FROM jobs s WHERE s.queue = q AND s.key = k AND s.status = 'started')
     AND NOT EXISTS (SELECT FROM jobs e
                     WHERE e.queue = q AND e.key = k AND e.status = 'pending' AND e.run_at <= now()
                       AND (e.priority > p OR (e.priority = p AND (e.run_at, e.id) < (r, i))))
$$;

-- jobs_due (022), passing over the jobs whose key's turn it is not: the
-- queue's first n due jobs a claim may start, in the queue's order. For a
-- queue without keys the added test is one NULL check a row.
CREATE OR REPLACE FUNCTION jobs_due(q text, asked bigint, n int) RETURNS TABLE (id bigint, priority int, run_at timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT j.id, j.priority, j.run_at FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at <= now()
    AND j.id = coalesce(asked, j.id)  -- not an OR: that makes the generic plan look dear
    AND (j.key IS NULL OR jobs_key_turn(q, j.key, j.priority, j.run_at, j.id))
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT n
$$;

-- jobs_insert and jobs_insert_many (015) with a key. The versions without
-- stay for programs that enqueue with an older lib.insert.
CREATE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int,
  p_key text
) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  written bigint;
BEGIN
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts, p_key,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name))
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  RETURN written;
END $$;

CREATE FUNCTION jobs_insert_many(
  p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb,
  p_max_attempts jsonb, p_keys jsonb
) RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
  RETURN QUERY
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
  SELECT j.queue, j.name, j.args, p_callsite, coalesce(j.run_at::timestamptz, now()), j.priority::int,
         j.max_attempts::int, j.key, EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = j.queue AND d.name = j.name)
  FROM ROWS FROM (jsonb_array_elements_text(p_queues), jsonb_array_elements_text(p_names),
                  jsonb_array_elements(p_args), jsonb_array_elements_text(p_run_ats),
                  jsonb_array_elements_text(p_priorities), jsonb_array_elements_text(p_max_attempts),
                  jsonb_array_elements_text(p_keys))
    WITH ORDINALITY AS j(queue, name, args, run_at, priority, max_attempts, key, n)
  ORDER BY j.n
  ON CONFLICT DO NOTHING
  RETURNING id;
END $$;
