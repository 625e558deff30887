-- list_all.sql: list.sql for a prefix that no name sorts above: the empty prefix (every
-- name), or one of U+10FFFF only, which every name at or above it starts with.
--
-- $1 the prefix  $2 the cursor ('' for the first page)  $3 page size
SELECT name, token IS NULL, fence, instance, label, acquired_at,
       greatest(floor(extract(epoch FROM expires_at - now()) * 1000000), 0)::bigint
FROM {{table}}
WHERE name >= $1::text AND name > $2::text AND expires_at > now()
ORDER BY name
LIMIT $3::bigint
