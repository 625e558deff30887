-- inspect.sql: what the table knows of one name (Inspector.Inspect).
--
-- $1 name
--
-- Returns no row for a name never taken (or reclaimed).
SELECT expires_at > now(), token IS NULL, fence, instance, label, acquired_at,
       greatest(floor(extract(epoch FROM expires_at - now()) * 1000000), 0)::bigint
FROM {{table}}
WHERE name = $1::text
