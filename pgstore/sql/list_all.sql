-- list_all.sql: list.sql for a prefix that no name sorts above: the empty prefix (every
-- name), or one of U+10FFFF only, which every name at or above it starts with.
--
-- $1 the prefix  $2, $3 the cursor (name, fence)  $4 page size
SELECT l.name, l.kept, l.fence, l.instance, l.label, l.value, l.shared, l.acquired_at,
       greatest(floor(extract(epoch FROM l.expires_at - now()) * 1000000), 0)::bigint,
       (SELECT count(*) FROM {{table}} AS c
        WHERE c.name = l.name AND c.token <> '' AND NOT c.waiting AND c.expires_at > now())
FROM {{table}} AS l
WHERE l.name >= $1::text AND (l.name, l.fence) > ($2::text, $3::bigint)
  AND l.token <> '' AND NOT l.waiting AND l.expires_at > now()
ORDER BY l.name, l.fence
LIMIT $4::bigint
