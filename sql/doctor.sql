-- Named queries on the database's own state (lib/store/vitals.py): `worker.py
-- doctor`, /metrics, the admin page's database page and the horizon watch.
-- They read the server's statistics views and catalogs only: no lock on the
-- jobs table or its indexes unless sizes are asked for.

-- name: doctor_vitals
-- The database's vital signs in one row: what holds back the MVCC horizon (up to `most` open transactions and standbys' walsenders of pg_stat_activity, prepared transactions, every replication slot of this database or of the whole server), the jobs table's rows, vacuums and transaction-ID age, its and its indexes' sizes when sizes is true (pg_relation_size takes each relation's AccessShareLock: the one lock here), the NOTIFY queue's use, the database's transaction-ID age, who asks (the role, whether superuser or a member of pg_read_all_stats), and the database's time.
WITH jobs_table AS (
  SELECT to_regclass('jobs') AS oid
),
-- Sessions of this database (a standby's walsender belongs to none, and its
-- feedback holds every database's horizon) whose snapshot or transaction ID
-- keeps dead rows: the oldest first. The server shows another role's pid,
-- application, xid and xmin to anyone, its query and start only to a member
-- of that role or of pg_read_all_stats. Autovacuum's own snapshot holds nothing back.
open_transactions AS (
  SELECT a.pid, a.usename, a.application_name, a.state, a.backend_type, a.query, a.xact_start,
         coalesce(a.backend_xid, a.backend_xmin)::text AS held_xid,
         greatest(age(a.backend_xid), age(a.backend_xmin)) AS xids
  FROM pg_stat_activity a
  WHERE (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
    AND a.pid <> pg_backend_pid()
    AND (a.datname = current_database() OR a.backend_type = 'walsender')
    AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
  ORDER BY xids DESC, a.xact_start
  LIMIT %(most)s::int
),
-- Where WAL is now, for how much a slot keeps; a standby has no insert position.
wal AS (
  SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn
)
SELECT
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'kind', coalesce((SELECT 'standby' WHERE t.backend_type = 'walsender'), 'transaction'),
            'pid', t.pid, 'role', t.usename, 'application', t.application_name, 'state', t.state,
            'query', CASE WHEN t.query <> '<insufficient privilege>'
                          THEN left(split_part(btrim(t.query, E' \t\r\n'), E'\n', 1), 200) END,
            'visible', t.query IS DISTINCT FROM '<insufficient privilege>',
            'seconds', extract(epoch FROM now() - t.xact_start), 'xids', t.xids, 'held_xid', t.held_xid
          ) ORDER BY t.xids DESC, t.xact_start), '[]')
   FROM open_transactions t) AS transactions,
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'kind', 'prepared', 'name', p.gid, 'role', p.owner, 'visible', true,
            'seconds', extract(epoch FROM now() - p.prepared), 'xids', age(p.transaction),
            'held_xid', p.transaction::text
          ) ORDER BY age(p.transaction) DESC), '[]')
   FROM pg_prepared_xacts p WHERE p.database = current_database()) AS prepared,
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'kind', 'slot', 'name', s.slot_name, 'slot_type', s.slot_type, 'active', s.active,
            'pid', s.active_pid, 'application', a.application_name, 'visible', true,
            'xids', age(s.xmin), 'catalog_xids', age(s.catalog_xmin), 'held_xid', s.xmin::text,
            'wal_bytes', pg_wal_lsn_diff((SELECT lsn FROM wal), s.restart_lsn)
          ) ORDER BY s.slot_name), '[]')
   FROM pg_replication_slots s
   LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
   WHERE s.database IS NULL OR s.database = current_database()) AS slots,
  c.oid IS NOT NULL AS has_jobs,
  st.n_live_tup AS live_rows,
  st.n_dead_tup AS dead_rows,
  st.last_vacuum, st.last_autovacuum, st.last_analyze, st.last_autoanalyze,
  current_setting('autovacuum')::boolean AS autovacuum_server,
  NOT EXISTS (SELECT FROM pg_options_to_table(c.reloptions) o
              WHERE o.option_name = 'autovacuum_enabled' AND NOT o.option_value::boolean) AS autovacuum_table,
  age(c.relfrozenxid) AS jobs_xid_age,
  CASE WHEN %(sizes)s::boolean THEN pg_relation_size(c.oid) END AS table_bytes,
  CASE WHEN %(sizes)s::boolean THEN pg_total_relation_size(c.oid) END AS total_bytes,
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'name', i.relname, 'bytes', CASE WHEN %(sizes)s::boolean THEN pg_relation_size(i.oid) END
          ) ORDER BY i.relname), '[]')
   FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
   WHERE x.indrelid = c.oid) AS indexes,
  pg_notification_queue_usage() AS notify_usage,
  (SELECT age(d.datfrozenxid) FROM pg_database d WHERE d.datname = current_database()) AS database_xid_age,
  current_database() AS database,
  current_user AS role,
  (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user) AS superuser,
  pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS reads_all_stats,
  now() AS now
FROM jobs_table
LEFT JOIN pg_class c ON c.oid = jobs_table.oid
LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid

-- name: doctor_owners
-- What a migration changes or creates that the role may not: the database it does not own, the jobs table's schema without CREATE, the tables given (sql/schema.sql's) and the functions named jobs_* of that schema owned by a role whose privileges it lacks; kind, name, owner, and the statement that gives it to the role.
WITH home AS (
  SELECT coalesce(
           (SELECT c.relnamespace FROM pg_class c WHERE c.oid = to_regclass('jobs')),
           (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
         ) AS oid
)
SELECT 'database' AS kind, d.datname::text AS name, pg_get_userbyid(d.datdba)::text AS owner,
       format('ALTER DATABASE %%I OWNER TO %%I', d.datname, current_user) AS fix
FROM pg_database d
WHERE d.datname = current_database() AND NOT pg_has_role(d.datdba, 'USAGE')
UNION ALL
SELECT 'schema', n.nspname::text, pg_get_userbyid(n.nspowner)::text,
       format('GRANT CREATE ON SCHEMA %%I TO %%I', n.nspname, current_user)
FROM pg_namespace n
WHERE n.oid = (SELECT oid FROM home) AND NOT has_schema_privilege(n.oid, 'CREATE')
UNION ALL
SELECT 'table', c.relname::text, pg_get_userbyid(c.relowner)::text,
       format('ALTER TABLE %%s OWNER TO %%I', c.oid::regclass, current_user)
FROM pg_class c
WHERE c.relnamespace = (SELECT oid FROM home) AND c.relkind IN ('r', 'p')
  AND c.relname = ANY (%(tables)s::text[]) AND NOT pg_has_role(c.relowner, 'USAGE')
UNION ALL
SELECT 'function', p.oid::regprocedure::text, pg_get_userbyid(p.proowner)::text,
       format('ALTER FUNCTION %%s OWNER TO %%I', p.oid::regprocedure, current_user)
FROM pg_proc p
WHERE p.pronamespace = (SELECT oid FROM home) AND p.proname LIKE 'jobs\_%%'
  AND NOT pg_has_role(p.proowner, 'USAGE')
ORDER BY 1, 2
