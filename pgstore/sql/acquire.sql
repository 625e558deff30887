-- acquire.sql: one attempt to take a lock, in one statement.
--
-- $1 name  $2 token  $3 lease in microseconds  $4 instance  $5 label
--
-- The INSERT takes a name nobody has used (or that Reclaim deleted). On conflict the row is
-- locked, and its latest version decides: it is taken over when its lease has ended by the
-- database's clock, or when it is already held by this token (a retry of an attempt whose
-- reply was lost: same fence, same acquired_at, new lease). Racers for one row queue on its
-- lock, so exactly one of them sees it expired.
--
-- The fence is the row's fence + 1, but never less than the database's time in microseconds
-- (the INSERT's value): a row that was lost or deleted starts again above every fence it gave.
--
-- Returns (true, fence, 0) when granted, (false, fence, remaining µs) when another owner
-- holds the name, read from the row as this statement's snapshot sees it; no row when the
-- holder's row is newer than the snapshot (busy, remaining unknown).
WITH granted AS (
    INSERT INTO {{table}} AS l (name, token, fence, expires_at, acquired_at, instance, label)
    VALUES ($1::text, $2::text, floor(extract(epoch FROM now()) * 1000000)::bigint,
            now() + $3::bigint * interval '1 microsecond', now(), $4::text, $5::text)
    ON CONFLICT (name) DO UPDATE SET
        token       = excluded.token,
        fence       = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.fence
                           ELSE greatest(l.fence + 1, excluded.fence) END,
        acquired_at = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.acquired_at
                           ELSE excluded.acquired_at END,
        expires_at  = excluded.expires_at,
        instance    = excluded.instance,
        label       = excluded.label
    WHERE l.expires_at <= now() OR l.token = excluded.token
    RETURNING l.fence
)
SELECT true, fence, 0::bigint FROM granted
UNION ALL
SELECT false, fence, greatest(floor(extract(epoch FROM expires_at - now()) * 1000000), 0)::bigint
FROM {{table}}
WHERE name = $1::text AND NOT EXISTS (SELECT FROM granted)
