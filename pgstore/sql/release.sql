-- release.sql: give a lock up if the token still holds it, and tell the listeners, in one
-- statement. The notification is sent when the statement commits, and only then.
--
-- $1 name  $2 token  $3 keep in microseconds (0: free it now)  $4 channel  $5 payload
--
-- The row stays (its fence keeps counting). The token is cleared, so that no token matches
-- any more: with keep 0 the lease ends now; with keep > 0 the name stays taken for keep, the
-- rest of a MinHold window, and a renewal of the old token still in flight cannot shorten
-- it. Returns one row when released, none when the token does not hold the name.
WITH released AS (
    UPDATE {{table}}
    SET token = NULL, expires_at = now() + $3::bigint * interval '1 microsecond'
    WHERE name = $1::text AND token = $2::text AND expires_at > now()
    RETURNING name
)
SELECT pg_notify($4::text, $5::text) FROM released
