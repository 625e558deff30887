-- force_release.sql: free a lock whoever holds it (Inspector.ForceRelease), keep its fence,
-- and tell the listeners, in one statement.
--
-- $1 name  $2 channel  $3 payload
--
-- Returns one row when the name was held (or kept), none when it was free.
WITH released AS (
    UPDATE {{table}}
    SET token = NULL, expires_at = now()
    WHERE name = $1::text AND expires_at > now()
    RETURNING name
)
SELECT pg_notify($2::text, $3::text) FROM released
