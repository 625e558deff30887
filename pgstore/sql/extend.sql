-- extend.sql: renew a batch of leases, in one statement.
--
-- $1 names  $2 tokens  $3 leases in microseconds (arrays of one length, one entry per lease)
--
-- Each hold still live under its token gets a lease from the database's now(). A lease whose
-- name is free, expired, held by another token, or kept for a MinHold window, or whose token
-- waits instead of holding, is left alone. Holds are rows of their own (create_table.sql):
-- renewing one locks its row only, never the name's. Returns the name and token of every
-- lease it renewed.
UPDATE {{table}} AS l
SET expires_at = now() + b.lease * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS b (name, token, lease)
WHERE l.name = b.name AND l.token = b.token AND l.token <> '' AND NOT l.waiting AND NOT l.kept
  AND l.expires_at > now()
RETURNING l.name, l.token
