-- reclaim.sql: delete the rows of names that have been free for longer than idle (Reclaim).
--
-- $1 idle in microseconds
--
-- A free row's expires_at is when it became free: its release, or the end of its lease.
DELETE FROM {{table}}
WHERE expires_at < now() - $1::bigint * interval '1 microsecond'
