-- list.sql: a page of live holds whose names start with a prefix, one entry per holder, in
-- name and fence order (Inspector.List).
--
-- $1 the prefix  $2 the least name above every name with that prefix
-- $3, $4 the cursor: the last name and fence of the previous page ('', 0 for the first)
-- $5 page size
--
-- The prefix is a range of the primary key, [$1, $2) in byte order, so the index scan ends
-- where the prefix does; no LIKE pattern, so no wildcard in a name can widen it.
SELECT l.name, l.kept, l.fence, l.instance, l.label, l.value, l.shared, l.acquired_at,
       greatest(floor(extract(epoch FROM l.expires_at - now()) * 1000000), 0)::bigint,
       (SELECT count(*) FROM {{table}} AS c
        WHERE c.name = l.name AND c.token <> '' AND NOT c.waiting AND c.expires_at > now())
FROM {{table}} AS l
WHERE l.name >= $1::text AND l.name < $2::text AND (l.name, l.fence) > ($3::text, $4::bigint)
  AND l.token <> '' AND NOT l.waiting AND l.expires_at > now()
ORDER BY l.name, l.fence
LIMIT $5::bigint
