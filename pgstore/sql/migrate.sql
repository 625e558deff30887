-- migrate.sql: brings a table of the previous layout — one row per name, the holder in it,
-- token NULL once released or kept for a MinHold window, primary key (name) — to the layout
-- of create_table.sql (CreateTable runs it; it does nothing to a table of the new layout).
--
-- Each old row becomes the name's row (token ''), with its fence; a held row also stays as
-- its holder's row, with its token, fence and lease, so that the holder (an instance of
-- either version) renews and releases it as before; a kept window keeps its end under a
-- token no caller has ('kept:' and its fence).
DO $migrate$
DECLARE
    pk text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute
               WHERE attrelid = {{regclass}} AND attname = 'waiting' AND NOT attisdropped) THEN
        RETURN;
    END IF;
    SELECT conname INTO pk FROM pg_catalog.pg_constraint WHERE conrelid = {{regclass}} AND contype = 'p';
    IF pk IS NOT NULL THEN
        EXECUTE 'ALTER TABLE ' || {{table_literal}} || ' DROP CONSTRAINT ' || quote_ident(pk);
    END IF;
    ALTER TABLE {{table}}
        ADD COLUMN value   text    NOT NULL DEFAULT '',
        ADD COLUMN shared  boolean NOT NULL DEFAULT false,
        ADD COLUMN kept    boolean NOT NULL DEFAULT false,
        ADD COLUMN waiting boolean NOT NULL DEFAULT false,
        ADD COLUMN lim     integer NOT NULL DEFAULT 0,
        ADD COLUMN lease   bigint  NOT NULL DEFAULT 0,
        ADD COLUMN attempt integer NOT NULL DEFAULT 0;
    UPDATE {{table}} SET token = 'kept:' || fence, kept = true WHERE token IS NULL AND expires_at > now();
    INSERT INTO {{table}} (name, token, fence, expires_at, acquired_at, instance, label)
    SELECT name, '', fence, expires_at, acquired_at, instance, label FROM {{table}} WHERE token IS NOT NULL;
    UPDATE {{table}} SET token = '' WHERE token IS NULL;
    ALTER TABLE {{table}} ALTER COLUMN token SET NOT NULL, ADD PRIMARY KEY (name, token);
END
$migrate$
