-- create_table.sql: the lock table (CreateTable). One row per lock name, kept across releases
-- so that its fence keeps counting; Reclaim deletes rows that have been free for long.
--
-- A name is held while expires_at is after the database's now(): by token when token is not
-- NULL, or, when token is NULL, kept for the rest of a MinHold window under no owner.
-- COLLATE "C": names sort byte by byte, as List pages through them.
CREATE TABLE IF NOT EXISTS {{table}} (
    name        text COLLATE "C" PRIMARY KEY,
    token       text,
    fence       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    instance    text        NOT NULL DEFAULT '',
    label       text        NOT NULL DEFAULT ''
)
