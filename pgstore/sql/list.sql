-- list.sql: a page of held locks whose names start with a prefix, in name order
-- (Inspector.List).
--
-- $1 the prefix  $2 the least name above every name with that prefix
-- $3 the cursor: the last name of the previous page ('' for the first)  $4 page size
--
-- The prefix is a range of the primary key, [$1, $2) in byte order, so the index scan ends
-- where the prefix does; no LIKE pattern, so no wildcard in a name can widen it.
SELECT name, token IS NULL, fence, instance, label, acquired_at,
       greatest(floor(extract(epoch FROM expires_at - now()) * 1000000), 0)::bigint
FROM {{table}}
WHERE name >= $1::text AND name < $2::text AND name > $3::text AND expires_at > now()
ORDER BY name
LIMIT $4::bigint
