-- Dedupe names that no process can switch off for another and that hold for
-- rows written before they were declared (jobs_dedupe_declare and
-- jobs_dedupe_mark, in force in sql/rules/dedupe.sql); clock ticks kept per
-- schedule entry.

-- A declaration of an earlier release deleted the names it did not list, so
-- rows of a declared name may have been written unmarked while another
-- process had it deleted. They are marked here, as jobs_dedupe_mark
-- (sql/rules/dedupe.sql) marks them: of identical live copies one is kept (a
-- row already marked, else a started one, else the oldest), the other
-- pending copies end as skipped, and no writer of jobs runs meanwhile.
--
-- That lock holds every writer of jobs while the live rows of the declared
-- names are read, and cannot be taken in batches: a copy written between
-- two batches could be kept twice. Only a database an earlier release of
-- this worker left with names declared has any: the original service's
-- table has none (the names came with 006), so its upgrade takes no lock here.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM job_dedupe_names) THEN
    RETURN;
  END IF;
  LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
  WITH live AS (
    SELECT j.id, j.status, j.dedupe,
           first_value(j.id) OVER (PARTITION BY j.queue, j.name, md5(j.args::text)
                                   ORDER BY j.dedupe DESC, j.status = 'started' DESC, j.id) AS keep
    FROM jobs j JOIN job_dedupe_names d ON d.queue = j.queue AND d.name = j.name
    WHERE j.status IN ('pending', 'started')
  ),
  ended AS (
    UPDATE jobs j SET status = 'skip: duplicate of job ' || l.keep, finished_at = now()
    FROM live l
    WHERE j.id = l.id AND l.id <> l.keep AND l.status = 'pending'
  )
  UPDATE jobs j SET dedupe = true
  FROM live l
  WHERE j.id = l.id AND l.id = l.keep AND NOT l.dedupe;
END $$;

-- A schedule may hold two entries of one job name with different args (or
-- queues): a tick belongs to the entry, named by a digest of its (queue, name,
-- args) that lib/background/clock.py computes. A row with entry '' names no
-- entry (it was written when a name could have only one): the clock counts it
-- for every entry of that name until it is pruned.
ALTER TABLE clock_ticks ADD COLUMN entry text NOT NULL DEFAULT '';
ALTER TABLE clock_ticks DROP CONSTRAINT clock_ticks_pkey, ADD PRIMARY KEY (name, entry, minute);
