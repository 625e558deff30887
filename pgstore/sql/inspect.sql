-- inspect.sql: what the table knows of one name (Inspector.Inspect): its newest live holder
-- (by fence), how many hold it and how many wait; for a free name, its last grant as the
-- name's row keeps it.
--
-- $1 name
--
-- Returns one row; every column but the counts is NULL for a name never taken (or
-- reclaimed).
SELECT h.token IS NOT NULL, coalesce(h.kept, false), coalesce(h.fence, n.fence),
       coalesce(h.instance, n.instance), coalesce(h.label, n.label), coalesce(h.value, n.value),
       coalesce(h.shared, false), coalesce(h.acquired_at, n.acquired_at),
       coalesce(greatest(floor(extract(epoch FROM h.expires_at - now()) * 1000000), 0), 0)::bigint,
       (SELECT count(*) FROM {{table}} AS c
        WHERE c.name = $1::text AND c.token <> '' AND NOT c.waiting AND c.expires_at > now()),
       (SELECT count(*) FROM {{table}} AS c WHERE c.name = $1::text AND c.waiting AND c.expires_at > now())
FROM (SELECT) AS one
LEFT JOIN {{table}} AS n ON n.name = $1::text AND n.token = ''
LEFT JOIN LATERAL (
    SELECT * FROM {{table}} AS c
    WHERE c.name = $1::text AND c.token <> '' AND NOT c.waiting AND c.expires_at > now()
    ORDER BY c.fence DESC LIMIT 1
) AS h ON true
