-- reclaim.sql: delete what has been dead or free for longer than idle (Reclaim): holders'
-- and waiters' rows whose lease or place ran out that long ago, and the rows of names none
-- of whose holders or waiters has been live since. Returns how many names' rows it deleted.
--
-- $1 idle in microseconds
--
-- A name's row's expires_at is the end of the longest lease or place it gave; a grant or a
-- new waiter moves it on, under the name's row lock, so a name taken while this runs is not
-- deleted (its row no longer matches when the DELETE reaches it).
WITH deleted AS (
DELETE FROM {{table}} AS l
WHERE l.expires_at < now() - $1::bigint * interval '1 microsecond'
  AND (l.token <> '' OR NOT EXISTS (
      SELECT FROM {{table}} AS o
      WHERE o.name = l.name AND o.token <> '' AND o.expires_at >= now() - $1::bigint * interval '1 microsecond'))
RETURNING l.token
)
SELECT count(*) FROM deleted WHERE token = ''
