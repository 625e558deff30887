-- channel.sql: the notification channel of the lock table. An expression: release.sql and
-- force_release.sql have it in place of {{channel}}, and a subscription selects it before it
-- listens. The database resolves the table as the statements do ({{regclass}} is the table's
-- name as a regclass literal), so every store on one table — however it spells the table:
-- schema.table or a search_path, folded or quoted — sends and listens on the same channel.
--
-- The channel is "guard:" and the table's schema-qualified name as the catalog has it, each
-- part quoted where SQL needs quotes (public.guard_locks, ops."Locks"); when that is longer
-- than a channel may be (63 bytes), "guard:" and its MD5.
(SELECT CASE WHEN octet_length(q) <= 57 THEN 'guard:' || q ELSE 'guard:' || md5(q) END
 FROM (SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS q
       FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
       WHERE c.oid = {{regclass}}) AS t)
