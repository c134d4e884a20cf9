-- The schema of a database at migration 034 (the last numbered migration before the rules
-- moved to sql/rules/), as pg_dump --schema-only printed it, and its schema_migrations rows:
-- what tests/db/test_schema.py upgrades from.


SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SET search_path = public;
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

CREATE FUNCTION public.jobs_attempt_errors(errors jsonb, row_status text, attempt integer, worker text, error text, traceback text) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
  SELECT CASE WHEN error IS NULL OR row_status <> 'started' THEN errors
              ELSE coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                     'attempt', attempt, 'at', now(), 'worker', worker, 'error', error, 'traceback', traceback))
         END
$$;

CREATE FUNCTION public.jobs_dedupe_declare(p_queue text, p_names text[], OUT added text[], OUT skipped integer) RETURNS record
    LANGUAGE plpgsql
    SET lock_timeout TO '100ms'
    AS $$
BEGIN
  added := '{}';
  skipped := 0;
  -- Every start declares its names; when they are all known, one read is the whole cost.
  IF NOT EXISTS (
    SELECT 1 FROM unnest(p_names) AS n(name)
    WHERE NOT EXISTS (SELECT 1 FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = n.name)
  ) THEN
    RETURN;
  END IF;
  -- A writer whose insert ran before the name showed was not marked by the
  -- trigger; this waits until every such transaction has committed (so the
  -- marking below sees its rows), and holds new writers until this commits
  -- (so their trigger sees the name). It conflicts with itself, so two
  -- processes declaring at once take turns. Only a new name pays for it.
  LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
  WITH new AS (
    INSERT INTO job_dedupe_names (queue, name)
    SELECT p_queue, unnest(p_names)
    ON CONFLICT DO NOTHING
    RETURNING name
  )
  SELECT coalesce(array_agg(name ORDER BY name), '{}') INTO added FROM new;
  IF added <> '{}' THEN
    skipped := jobs_dedupe_mark(p_queue, added);
  END IF;
END $$;

CREATE FUNCTION public.jobs_dedupe_mark(p_queue text, p_names text[]) RETURNS integer
    LANGUAGE sql
    AS $$
  WITH live AS (
    SELECT id, status, dedupe,
           first_value(id) OVER (PARTITION BY name, md5(args::text)
                                 ORDER BY dedupe DESC, status = 'started' DESC, id) AS keep
    FROM jobs
    WHERE queue = p_queue AND name = ANY(p_names) AND status IN ('pending', 'started')
  ),
  ended AS (
    UPDATE jobs j SET status = 'skip: duplicate of job ' || l.keep, finished_at = now()
    FROM live l
    WHERE j.id = l.id AND l.id <> l.keep AND l.status = 'pending'
    RETURNING j.id
  ),
  -- Disjoint from ended, so the unique index never sees two live copies.
  marked AS (
    UPDATE jobs j SET dedupe = true
    FROM live l
    WHERE j.id = l.id AND l.id = l.keep AND NOT l.dedupe
  )
  SELECT count(*)::int FROM ended
$$;

CREATE FUNCTION public.jobs_due(q text, asked bigint, n integer) RETURNS TABLE(id bigint, priority integer, run_at timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
  SELECT j.id, j.priority, j.run_at FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at <= now()
    AND coalesce(j.id = asked, true)
    AND (j.key IS NULL OR jobs_key_turn(q, j.key, j.priority, j.run_at, j.id))
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT n
$$;

CREATE FUNCTION public.jobs_gate(q text) RETURNS TABLE(gate timestamp with time zone, rate_key text, scaled_to integer)
    LANGUAGE sql STABLE
    AS $$
  SELECT greatest(jq.paused_until, jq.next_claim_at), jq.rate_key, jq.scaled_to FROM job_queues jq WHERE jq.queue = q
$$;

CREATE FUNCTION public.jobs_gate_wait(gate timestamp with time zone) RETURNS double precision
    LANGUAGE sql STABLE
    AS $$ SELECT extract(EPOCH FROM least(gate, now() + interval '1 day') - now())::float8 $$;

CREATE FUNCTION public.jobs_insert(p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamp with time zone, p_priority integer, p_max_attempts integer) RETURNS bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  written bigint;
BEGIN
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, dedupe)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name))
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  RETURN written;
END $$;

CREATE FUNCTION public.jobs_insert(p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamp with time zone, p_priority integer, p_max_attempts integer, p_key text) RETURNS bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET "jobs.inserting_checked" TO 'on'
    AS $$
DECLARE
  written bigint;
BEGIN
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts, p_key,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name))
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  -- A row the dedupe index suppressed is no new work: nobody is woken, as
  -- the trigger wakes nobody for a statement that wrote no row.
  IF written IS NOT NULL THEN
    PERFORM pg_notify('jobs', p_queue);
  END IF;
  RETURN written;
END $$;

CREATE FUNCTION public.jobs_insert_many(p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb, p_max_attempts jsonb) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
  RETURN QUERY
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, dedupe)
  SELECT j.queue, j.name, j.args, p_callsite, coalesce(j.run_at::timestamptz, now()), j.priority::int,
         j.max_attempts::int, EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = j.queue AND d.name = j.name)
  FROM ROWS FROM (jsonb_array_elements_text(p_queues), jsonb_array_elements_text(p_names),
                  jsonb_array_elements(p_args), jsonb_array_elements_text(p_run_ats),
                  jsonb_array_elements_text(p_priorities), jsonb_array_elements_text(p_max_attempts))
    WITH ORDINALITY AS j(queue, name, args, run_at, priority, max_attempts, n)
  ORDER BY j.n
  ON CONFLICT DO NOTHING
  RETURNING id;
END $$;

CREATE FUNCTION public.jobs_insert_many(p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb, p_max_attempts jsonb, p_keys jsonb) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.jobs_inserted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
  wrong record;
BEGIN
  SELECT i.queue, i.name, i.dedupe INTO wrong FROM inserted i
  WHERE i.dedupe <> EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = i.queue AND d.name = i.name)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'jobs.dedupe of (%, %) must be %: it follows job_dedupe_names; leave the column out',
      wrong.queue, wrong.name, (NOT wrong.dedupe)::text
      USING ERRCODE = 'check_violation';
  END IF;
  PERFORM pg_notify('jobs', queue)
  FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'pending') AS q;
  RETURN NULL;
END $$;

CREATE FUNCTION public.jobs_key_turn(q text, k text, p integer, r timestamp with time zone, i bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
  SELECT NOT EXISTS (SELECT FROM jobs s WHERE s.queue = q AND s.key = k AND s.status = 'started')
     AND NOT EXISTS (SELECT FROM jobs e
                     WHERE e.queue = q AND e.key = k AND e.status = 'pending' AND e.run_at <= now()
                       AND (e.priority > p OR (e.priority = p AND (e.run_at, e.id) < (r, i))))
$$;

CREATE FUNCTION public.jobs_next_due_wait(q text) RETURNS TABLE(wait double precision)
    LANGUAGE sql STABLE
    AS $$
  SELECT extract(EPOCH FROM min(j.run_at) - now())::float8 FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at > now()
$$;

CREATE FUNCTION public.jobs_notify_updated() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  PERFORM pg_notify('jobs', NEW.queue);
  RETURN NULL;
END $$;

CREATE FUNCTION public.jobs_outcome_current(row_worker text, row_attempts integer, row_status text, o_worker text, o_attempts integer, o_status text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
  SELECT row_worker = o_worker AND row_attempts = o_attempts AND row_status IN ('started', o_status)
$$;

CREATE FUNCTION public.jobs_queue_turn(queue text) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT pg_try_advisory_xact_lock(1785684595, hashtext(queue)) $$;

CREATE FUNCTION public.jobs_rate_take(k text) RETURNS void
    LANGUAGE sql
    AS $$
  UPDATE job_rates SET tat = greatest(tat, now()) + make_interval(secs => spacing * cost)
  WHERE coalesce(grp, key) = k
$$;

CREATE FUNCTION public.jobs_rate_wait(k text) RETURNS TABLE(wait double precision)
    LANGUAGE sql
    AS $$
  WITH locked AS (
    SELECT extract(EPOCH FROM greatest(r.tat, now()) - now())::float8 - r.spacing * (r.burst - r.cost) AS wait
    FROM job_rates r WHERE coalesce(r.grp, r.key) = k
    FOR NO KEY UPDATE SKIP LOCKED
  )
  SELECT max(locked.wait) FROM locked
  HAVING count(*) = (SELECT count(*) FROM job_rates r WHERE coalesce(r.grp, r.key) = k)
$$;

CREATE FUNCTION public.jobs_set_dedupe() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  NEW.dedupe := EXISTS (
    SELECT 1 FROM job_dedupe_names d WHERE d.queue = NEW.queue AND d.name = NEW.name
  );
  RETURN NEW;
END $$;

CREATE FUNCTION public.jobs_slot_holder(q text, s integer) RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
  SELECT j.id FROM jobs j WHERE j.queue = q AND j.status = 'started' AND j.slot = s
$$;

CREATE FUNCTION public.jobs_step(o_ids bigint[], o_workers text[], o_attempts integer[], o_statuses text[], o_retry_ins double precision[], o_last_errors text[], o_tracebacks text[], o_delays double precision[], o_uncounted integer[], c_queues text[], c_slots integer[], c_workers text[], c_leases double precision[], c_max_attempts integer[], c_ids bigint[]) RETURNS TABLE(queue text, worker_id text, id bigint, name text, args text, attempts integer, max_attempts integer, callsite text, latency double precision, wait double precision, slot integer)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
  throttled text;
  busy text[];
  -- Queues whose throttling outcomes wait for another try: their turn or gate row is held.
  held_queues text[] := '{}';
  -- The queues asked for that have a rate: claimed ask by ask, below.
  rated text[];
  r record;
BEGIN
  IF cardinality(o_ids) > 0 THEN
    -- A throttling outcome takes its queue's turn (the claim's, below) until it
    -- commits, so no claim reads the gate in between; and the queue's gate row.
    -- Neither is waited for.
    IF 0 < ANY(o_delays) THEN  -- an expression, not a query: the common case costs nothing
      FOR throttled IN
        SELECT DISTINCT j.queue FROM jobs j JOIN unnest(o_ids, o_delays) o(id, delay) ON j.id = o.id
        WHERE o.delay > 0 ORDER BY j.queue
      LOOP
        IF NOT jobs_throttle_turn(throttled) THEN
          held_queues := held_queues || throttled;
        END IF;
      END LOOP;
    END IF;
    RETURN QUERY
    WITH o AS (
      SELECT * FROM unnest(o_ids, o_workers, o_attempts, o_statuses, o_retry_ins, o_last_errors,
                           o_tracebacks, o_delays, o_uncounted)
        AS o(id, worker_id, attempts, status, retry_in, last_error, traceback, delay, uncounted)
    ),
    mine AS (
      -- The rows this batch may write now: still this claim's (or holding this
      -- very outcome), not held by another transaction, and not a throttling
      -- outcome of a queue whose turn or gate row is held; each with its outcome.
      SELECT j.id, o.status, o.retry_in, o.last_error, o.traceback, o.delay, o.uncounted
      FROM jobs j JOIN o ON j.id = o.id
      WHERE jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
        AND NOT (o.delay > 0 AND j.queue = ANY(held_queues))
      FOR UPDATE OF j SKIP LOCKED
    ),
    done AS (
      UPDATE jobs j
      SET status = m.status,
          finished_at = CASE WHEN m.retry_in IS NULL THEN now() END,
          -- A retry waits retry_in; an interrupted job (retry_in 0) keeps its place in the queue.
          run_at = CASE WHEN coalesce(m.retry_in, 0) = 0 THEN j.run_at
                        ELSE now() + make_interval(secs => m.retry_in) END,
          last_error = coalesce(m.last_error, j.last_error),
          -- Goes with last_error: a new error replaces it (with NULL when it has none).
          last_traceback = CASE WHEN m.last_error IS NULL THEN j.last_traceback ELSE m.traceback END,
          attempt_errors = jobs_attempt_errors(j.attempt_errors, j.status, j.attempts, j.worker_id, m.last_error, m.traceback),
          -- An attempt that did not count (a snooze) gives its allowance back.
          max_attempts = j.max_attempts + m.uncounted,
          lease_until = NULL, slot = NULL
      FROM mine m
      WHERE j.id = m.id
      RETURNING j.id, j.queue, m.delay
    ),
    gated AS (
      INSERT INTO job_queues (queue, next_claim_at)
      SELECT done.queue, now() + make_interval(secs => max(done.delay)) FROM done
      WHERE done.delay > 0
      GROUP BY done.queue
      ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at
    ),
    waiting AS (
      -- Still this claim's but not written: held by another transaction, or its
      -- queue's turn is. Asked again by the worker. Only the outcomes not
      -- written are looked up (the filter is on o, not on the row).
      SELECT j.id FROM o JOIN jobs j ON j.id = o.id
      WHERE o.id NOT IN (SELECT mine.id FROM mine)
        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
    )
    SELECT NULL::text, NULL::text, done.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, NULL::float8, NULL::int
    FROM done
    UNION ALL
    SELECT NULL::text, NULL::text, waiting.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, 0.05::float8, NULL::int
    FROM waiting;
  END IF;
  IF cardinality(c_queues) = 0 THEN
    RETURN;
  END IF;
  -- Each queue's turn (jobs_queue_turn), never waited for: the queues whose
  -- turn another transaction holds now; and, in the same statement, the
  -- queues with a rate (job_queues' key).
  SELECT array_agg(t.q) FILTER (WHERE NOT t.mine), coalesce(array_agg(t.q) FILTER (WHERE t.rated), '{}')
  INTO busy, rated
  FROM (SELECT d.q, jobs_queue_turn(d.q) AS mine,
               EXISTS (SELECT FROM job_queues jq WHERE jq.queue = d.q AND jq.rate_key IS NOT NULL) AS rated
        FROM (SELECT DISTINCT u.q FROM unnest(c_queues) u(q)) d) t;
  -- A queue with a rate claims ask by ask, each through jobs_step_one, so
  -- each claim takes from its rate's row before the next claim reads it (two
  -- queues of this batch may share one).
  IF cardinality(rated) > 0 THEN
    FOR r IN
      SELECT c.q, c.s, c.w, c.l, c.m, c.i
      FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
      WHERE c.q = ANY(rated)
    LOOP
      RETURN QUERY SELECT * FROM jobs_step_one(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               r.q, r.s, r.w, r.l, r.m, r.i);
    END LOOP;
  END IF;
  -- A statement after the locks: its snapshot holds what committed before them.
  RETURN QUERY
  WITH ask AS (
    SELECT c.q, c.s, c.w, c.l, c.m, c.i
    FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
    WHERE NOT (c.q = ANY(rated))
  ),
  grp AS (
    SELECT a.q, a.w, a.l, a.m, a.i,
           a.q = ANY(coalesce(busy, '{}')) AS busy,
           jg.gate,
           -- A slot from the concurrency set at run time up is not free.
           array_agg(a.s ORDER BY a.s) FILTER (WHERE NOT EXISTS (SELECT FROM jobs_slot_holder(a.q, a.s))
                                                 AND a.s < coalesce(jg.scaled_to, a.s + 1)) AS free
    FROM ask a
    LEFT JOIN LATERAL jobs_gate(a.q) jg ON true
    GROUP BY a.q, a.w, a.l, a.m, a.i, jg.gate, jg.scaled_to
  ),
  heads AS (
    SELECT g.q, g.w, g.l, g.m, g.free, h.id, h.n
    FROM grp g
    CROSS JOIN LATERAL (
      SELECT o.id, row_number() OVER (ORDER BY o.priority DESC, o.run_at, o.id)::int AS n
      FROM jobs_due(g.q, g.i, cardinality(g.free)) o
    ) h
    WHERE NOT g.busy AND g.free IS NOT NULL AND NOT coalesce(g.gate > now(), false)
  ),
  locked AS (
    -- The heads looked up by key, one by one (an array of ids is estimated
    -- at a few): a join with heads, estimated from a long queue's backlog,
    -- was planned as a scan of the whole table.
    SELECT j.id FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT heads.id FROM heads)) AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
  ),
  -- Each queue's first head that could not be locked: none of its order
  -- from there on is claimed, never job n+1 while job n is due and not started.
  stuck AS (
    SELECT e.q, e.w, min(e.n) AS n FROM heads e
    WHERE e.id NOT IN (SELECT k.id FROM locked k)
    GROUP BY e.q, e.w
  ),
  picked AS (
    -- The prefix of each queue's order that could be locked.
    SELECT h.* FROM heads h LEFT JOIN stuck x ON x.q = h.q AND x.w = h.w
    WHERE x.n IS NULL OR h.n < x.n
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
           WHEN g.gate > now() THEN jobs_gate_wait(g.gate)
           WHEN g.free IS NULL THEN NULL::float8  -- every slot asked for is taken
           WHEN EXISTS (SELECT 1 FROM heads h WHERE h.q = g.q AND h.w = g.w) THEN 0.05::float8  -- its head is held
           ELSE (SELECT nd.wait FROM jobs_next_due_wait(g.q) nd)
         END,
         NULL::int
  FROM grp g
  WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.q = g.q AND c.w = g.w);
END
$$;

CREATE FUNCTION public.jobs_step_one(o_id bigint, o_worker text, o_attempts integer, o_status text, o_retry_in double precision, o_last_error text, o_traceback text, o_delay double precision, o_uncounted integer, c_queue text, c_slot integer, c_worker text, c_lease double precision, c_max_attempts integer, c_id bigint) RETURNS TABLE(queue text, worker_id text, id bigint, name text, args text, attempts integer, max_attempts integer, callsite text, latency double precision, wait double precision, slot integer)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
  done_queue text;
  gate timestamptz;
  head bigint;
  held boolean := false;
  taken boolean;
  rate_key text;
  rate_wait float8;
BEGIN
  IF o_id IS NOT NULL THEN
    IF o_delay > 0 THEN
      SELECT j.queue INTO done_queue FROM jobs j WHERE j.id = o_id;
      held := NOT jobs_throttle_turn(done_queue);
    END IF;
    IF NOT held THEN
      UPDATE jobs j
      SET status = o_status,
          finished_at = CASE WHEN o_retry_in IS NULL THEN now() END,
          run_at = CASE WHEN coalesce(o_retry_in, 0) = 0 THEN j.run_at
                        ELSE now() + make_interval(secs => o_retry_in) END,
          last_error = coalesce(o_last_error, j.last_error),
          last_traceback = CASE WHEN o_last_error IS NULL THEN j.last_traceback ELSE o_traceback END,
          attempt_errors = jobs_attempt_errors(j.attempt_errors, j.status, j.attempts, j.worker_id, o_last_error, o_traceback),
          max_attempts = j.max_attempts + o_uncounted,
          lease_until = NULL, slot = NULL
      WHERE j.id = (SELECT k.id FROM jobs k WHERE k.id = o_id FOR UPDATE SKIP LOCKED)
        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o_worker, o_attempts, o_status)
      RETURNING j.queue INTO done_queue;
      IF FOUND THEN
        IF o_delay > 0 THEN
          INSERT INTO job_queues (queue, next_claim_at) VALUES (done_queue, now() + make_interval(secs => o_delay))
          ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at;
        END IF;
        id := o_id;  -- the outcome's row: its id alone
        RETURN NEXT;
        id := NULL;
      ELSE
        -- Not written: the row is another claim's now (rescued), or another transaction holds it.
        held := EXISTS (SELECT FROM jobs j WHERE j.id = o_id
                        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o_worker, o_attempts, o_status));
      END IF;
    END IF;
    IF held THEN
      id := o_id;
      wait := 0.05;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  IF c_queue IS NULL THEN
    RETURN;
  END IF;
  -- The claim's row: its queue and worker, and the job claimed or the wait.
  queue := c_queue;
  worker_id := c_worker;
  IF NOT jobs_queue_turn(c_queue) THEN
    wait := 0.05;
    RETURN NEXT;
    RETURN;
  END IF;
  -- Statements after the lock: their snapshots hold what committed before it.
  -- A slot from the concurrency set at run time up is taken.
  SELECT jg.gate, jg.rate_key,
         coalesce(c_slot >= jg.scaled_to, false) OR EXISTS (SELECT FROM jobs_slot_holder(c_queue, c_slot))
  INTO gate, rate_key, taken
  FROM (VALUES (1)) one LEFT JOIN jobs_gate(c_queue) jg ON true;
  IF gate > now() THEN
    wait := jobs_gate_wait(gate);
    RETURN NEXT;
    RETURN;
  END IF;
  IF taken THEN
    RETURN NEXT;  -- the slot is taken, or above the concurrency set: no wait known
    RETURN;
  END IF;
  IF rate_key IS NOT NULL THEN
    SELECT d.id INTO head FROM jobs_due(c_queue, c_id, 1) d;
    IF head IS NULL THEN
      SELECT nd.wait INTO wait FROM jobs_next_due_wait(c_queue) nd;
      RETURN NEXT;
      RETURN;
    END IF;
    -- The rate's row, locked until this transaction commits; held by another
    -- claim of the same rate: that claim's answer is needed first.
    SELECT rw.wait INTO rate_wait FROM jobs_rate_wait(rate_key) rw;
    IF NOT FOUND OR rate_wait > 0 THEN
      wait := coalesce(rate_wait, 0.05);
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  -- The head only (the one read above, when there was one): when another
  -- transaction holds it, nothing, never the row behind it.
  UPDATE jobs j
  SET status = 'started', started_at = now(), finished_at = NULL,
      attempts = j.attempts + 1,
      max_attempts = coalesce(j.max_attempts, c_max_attempts),
      worker_id = c_worker, slot = c_slot,
      lease_until = clock_timestamp() + make_interval(secs => c_lease)
  WHERE j.id = (SELECT k.id FROM jobs k
                WHERE k.id = (SELECT d.id FROM jobs_due(c_queue, coalesce(head, c_id), 1) d) AND k.status = 'pending'
                FOR UPDATE SKIP LOCKED)
  RETURNING j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
            greatest(extract(EPOCH FROM now() - j.run_at), 0)
  INTO id, name, args, attempts, max_attempts, callsite, latency;
  IF FOUND THEN
    slot := c_slot;
    IF rate_key IS NOT NULL THEN
      PERFORM jobs_rate_take(rate_key);
    END IF;
    RETURN NEXT;
    RETURN;
  END IF;
  -- Nothing claimed: nothing due (the next due job's wait), or its head is held.
  IF head IS NULL THEN
    SELECT d.id INTO head FROM jobs_due(c_queue, c_id, 1) d;
  END IF;
  IF head IS NULL THEN
    SELECT nd.wait INTO wait FROM jobs_next_due_wait(c_queue) nd;
  ELSE
    wait := 0.05;
  END IF;
  RETURN NEXT;
END
$$;

CREATE FUNCTION public.jobs_throttle_turn(q text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
  IF NOT jobs_queue_turn(q) THEN
    RETURN false;
  END IF;
  PERFORM FROM job_queues jq WHERE jq.queue = q FOR UPDATE SKIP LOCKED;
  RETURN FOUND OR NOT EXISTS (SELECT FROM job_queues jq WHERE jq.queue = q);
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TABLE public.anthropic_answers (
    key text NOT NULL,
    model text NOT NULL,
    prompt text NOT NULL,
    answer text NOT NULL,
    usage jsonb,
    answered_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.apollo_organizations (
    domain text NOT NULL,
    data jsonb NOT NULL,
    fetched_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.cache_entries (
    key text NOT NULL,
    value jsonb NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE public.clock_ticks (
    name text NOT NULL,
    minute timestamp with time zone NOT NULL,
    entry text DEFAULT ''::text NOT NULL
);

CREATE TABLE public.github_repos (
    full_name text NOT NULL,
    data jsonb NOT NULL,
    fetched_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.github_users (
    login text NOT NULL,
    data jsonb NOT NULL,
    fetched_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.job_dedupe_names (
    queue text NOT NULL,
    name text NOT NULL
);

CREATE TABLE public.job_minutes (
    queue text NOT NULL,
    minute timestamp with time zone NOT NULL,
    ok integer DEFAULT 0 NOT NULL,
    fail integer DEFAULT 0 NOT NULL,
    skip integer DEFAULT 0 NOT NULL,
    err integer DEFAULT 0 NOT NULL,
    latency_p50 double precision,
    latency_p95 double precision,
    backlog integer
);

CREATE TABLE public.job_queues (
    queue text NOT NULL,
    paused_until timestamp with time zone,
    pause_reason text,
    next_claim_at timestamp with time zone,
    rate_key text,
    scaled_to integer,
    scaled_by text,
    scaled_at timestamp with time zone,
    CONSTRAINT job_queues_scaled_to_check CHECK ((scaled_to >= 1))
);

CREATE TABLE public.job_rates (
    key text NOT NULL,
    spacing double precision NOT NULL,
    burst integer NOT NULL,
    tat timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    grp text,
    cost double precision DEFAULT 1 NOT NULL,
    CONSTRAINT job_rates_burst_check CHECK ((burst >= 1)),
    CONSTRAINT job_rates_cost CHECK (((cost > (0)::double precision) AND (cost <= (burst)::double precision))),
    CONSTRAINT job_rates_spacing_check CHECK ((spacing > (0)::double precision))
);

CREATE TABLE public.jobs (
    id bigint NOT NULL,
    queue text NOT NULL,
    name text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    callsite text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    priority integer DEFAULT 0 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer,
    worker_id text,
    lease_until timestamp with time zone,
    slot integer,
    last_error text,
    dedupe boolean NOT NULL,
    last_traceback text,
    attempt_errors jsonb,
    key text,
    CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at))
);

CREATE SEQUENCE public.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.jobs_id_seq OWNED BY public.jobs.id;

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.slack_posts (
    job_id bigint NOT NULL,
    channel text NOT NULL,
    ts text,
    posted_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.workers (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    started_at timestamp with time zone NOT NULL,
    last_seen timestamp with time zone NOT NULL,
    lease_seconds double precision NOT NULL,
    handles jsonb DEFAULT '{}'::jsonb NOT NULL
);

ALTER TABLE ONLY public.jobs ALTER COLUMN id SET DEFAULT nextval('public.jobs_id_seq'::regclass);

ALTER TABLE ONLY public.anthropic_answers
    ADD CONSTRAINT anthropic_answers_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.apollo_organizations
    ADD CONSTRAINT apollo_organizations_pkey PRIMARY KEY (domain);

ALTER TABLE ONLY public.cache_entries
    ADD CONSTRAINT cache_entries_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.clock_ticks
    ADD CONSTRAINT clock_ticks_pkey PRIMARY KEY (name, entry, minute);

ALTER TABLE ONLY public.github_repos
    ADD CONSTRAINT github_repos_pkey PRIMARY KEY (full_name);

ALTER TABLE ONLY public.github_users
    ADD CONSTRAINT github_users_pkey PRIMARY KEY (login);

ALTER TABLE ONLY public.job_dedupe_names
    ADD CONSTRAINT job_dedupe_names_pkey PRIMARY KEY (queue, name);

ALTER TABLE ONLY public.job_minutes
    ADD CONSTRAINT job_minutes_pkey PRIMARY KEY (queue, minute);

ALTER TABLE ONLY public.job_queues
    ADD CONSTRAINT job_queues_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY public.job_rates
    ADD CONSTRAINT job_rates_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.slack_posts
    ADD CONSTRAINT slack_posts_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY public.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

CREATE INDEX cache_entries_expires ON public.cache_entries USING btree (expires_at);

CREATE INDEX job_minutes_minute ON public.job_minutes USING btree (minute);

CREATE INDEX job_rates_grp ON public.job_rates USING btree (COALESCE(grp, key));

CREATE INDEX jobs_args ON public.jobs USING gin (args jsonb_path_ops);

CREATE INDEX jobs_claim ON public.jobs USING btree (queue, priority DESC, run_at, id) WHERE (status = 'pending'::text);

CREATE INDEX jobs_created ON public.jobs USING brin (created_at timestamptz_minmax_multi_ops);

CREATE UNIQUE INDEX jobs_dedupe ON public.jobs USING btree (queue, name, md5((args)::text)) WHERE (dedupe AND (status = ANY (ARRAY['pending'::text, 'started'::text])));

CREATE INDEX jobs_failed ON public.jobs USING btree (finished_at) WHERE starts_with(status, 'err: '::text);

CREATE INDEX jobs_failed_queue ON public.jobs USING btree (queue, name, finished_at) WHERE starts_with(status, 'err: '::text);

CREATE INDEX jobs_finished ON public.jobs USING btree (finished_at) WHERE (status <> ALL (ARRAY['pending'::text, 'started'::text]));

CREATE INDEX jobs_key_pending ON public.jobs USING btree (queue, key, priority DESC, run_at, id) WHERE ((status = 'pending'::text) AND (key IS NOT NULL));

CREATE UNIQUE INDEX jobs_key_started ON public.jobs USING btree (queue, key) WHERE ((status = 'started'::text) AND (key IS NOT NULL));

CREATE INDEX jobs_pending_due ON public.jobs USING btree (queue, run_at) INCLUDE (attempts) WHERE (status = 'pending'::text);

CREATE UNIQUE INDEX jobs_started_slot ON public.jobs USING btree (queue, slot) WHERE (status = 'started'::text);

CREATE TRIGGER jobs_inserted AFTER INSERT ON public.jobs REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT WHEN ((current_setting('jobs.inserting_checked'::text, true) IS DISTINCT FROM 'on'::text)) EXECUTE FUNCTION public.jobs_inserted();

CREATE TRIGGER jobs_notify_updated AFTER UPDATE OF status ON public.jobs FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND (new.status = 'pending'::text))) EXECUTE FUNCTION public.jobs_notify_updated();

CREATE TRIGGER jobs_set_dedupe BEFORE INSERT ON public.jobs FOR EACH ROW WHEN ((new.dedupe IS NULL)) EXECUTE FUNCTION public.jobs_set_dedupe();

ALTER TABLE public.jobs ENABLE ALWAYS TRIGGER jobs_set_dedupe;


INSERT INTO public.schema_migrations (version, name) VALUES (1, '001_jobs');
INSERT INTO public.schema_migrations (version, name) VALUES (2, '002_jobs_extend');
INSERT INTO public.schema_migrations (version, name) VALUES (3, '003_cache_entries');
INSERT INTO public.schema_migrations (version, name) VALUES (4, '004_notify');
INSERT INTO public.schema_migrations (version, name) VALUES (5, '005_clock');
INSERT INTO public.schema_migrations (version, name) VALUES (6, '006_dedupe');
INSERT INTO public.schema_migrations (version, name) VALUES (7, '007_job_queues');
INSERT INTO public.schema_migrations (version, name) VALUES (8, '008_api_results');
INSERT INTO public.schema_migrations (version, name) VALUES (9, '009_dedupe_clock_entries');
INSERT INTO public.schema_migrations (version, name) VALUES (10, '010_run_at_finite');
INSERT INTO public.schema_migrations (version, name) VALUES (11, '011_workers');
INSERT INTO public.schema_migrations (version, name) VALUES (12, '012_jobs_failed');
INSERT INTO public.schema_migrations (version, name) VALUES (13, '013_last_traceback');
INSERT INTO public.schema_migrations (version, name) VALUES (14, '014_claim_functions');
INSERT INTO public.schema_migrations (version, name) VALUES (15, '015_insert_sets_dedupe');
INSERT INTO public.schema_migrations (version, name) VALUES (16, '016_jobs_failed_queue');
INSERT INTO public.schema_migrations (version, name) VALUES (17, '017_step_one');
INSERT INTO public.schema_migrations (version, name) VALUES (18, '018_no_shared_waits');
INSERT INTO public.schema_migrations (version, name) VALUES (19, '019_worker_handles');
INSERT INTO public.schema_migrations (version, name) VALUES (20, '020_dedupe_declare_lock_timeout');
INSERT INTO public.schema_migrations (version, name) VALUES (21, '021_slack_post_begun');
INSERT INTO public.schema_migrations (version, name) VALUES (22, '022_rules_once');
INSERT INTO public.schema_migrations (version, name) VALUES (23, '023_jobs_args_index');
INSERT INTO public.schema_migrations (version, name) VALUES (24, '024_job_minutes');
INSERT INTO public.schema_migrations (version, name) VALUES (25, '025_rates_scale_attempt_errors');
INSERT INTO public.schema_migrations (version, name) VALUES (26, '026_keys');
INSERT INTO public.schema_migrations (version, name) VALUES (27, '027_pending_counts');
INSERT INTO public.schema_migrations (version, name) VALUES (28, '028_budgets');
INSERT INTO public.schema_migrations (version, name) VALUES (29, '029_leaner_steps');
INSERT INTO public.schema_migrations (version, name) VALUES (30, '030_linear_outcomes');
INSERT INTO public.schema_migrations (version, name) VALUES (31, '031_ordered_heads');
INSERT INTO public.schema_migrations (version, name) VALUES (32, '032_heads_by_key');
INSERT INTO public.schema_migrations (version, name) VALUES (33, '033_no_lease_index');
INSERT INTO public.schema_migrations (version, name) VALUES (34, '034_insert_wakes_itself');
