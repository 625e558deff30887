-- create_table.sql: the lock table (CreateTable), when it does not exist yet.
--
-- Rows of a name, all with the name's key (name, token):
--   - the name's row, token '': the last fence given (fences and places in the queue both
--     count it up), and the last grant's time, instance, label and value; the lock on this row
--     is what every change of the name's holders and queue takes first, so that those changes
--     happen one at a time per name. Kept after the name is free, so that fences keep
--     counting; Reclaim deletes it once the name has been free for long.
--   - a holder's row, waiting false: its token, fence, lease (expires_at) and metadata; shared
--     or not. kept: released for the rest of a MinHold window, which no token extends or
--     releases, and which counts as a holder.
--   - a waiter's row, waiting true: its place in the queue (fence: the queue's order),
--     until when it keeps it (expires_at), and what it asked for (shared, lim, the lease a
--     hand-over gives it, the attempt that last refreshed it).
-- A holder's or waiter's row whose expires_at is past is dead, and the next change of the
-- name deletes it.
--
-- COLLATE "C": names sort byte by byte, as List pages through them.
CREATE TABLE IF NOT EXISTS {{table}} (
    name        text COLLATE "C" NOT NULL,
    token       text        NOT NULL,
    fence       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    instance    text        NOT NULL DEFAULT '',
    label       text        NOT NULL DEFAULT '',
    value       text        NOT NULL DEFAULT '',
    shared      boolean     NOT NULL DEFAULT false,
    kept        boolean     NOT NULL DEFAULT false,
    waiting     boolean     NOT NULL DEFAULT false,
    lim         integer     NOT NULL DEFAULT 0,
    lease       bigint      NOT NULL DEFAULT 0,
    attempt     integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (name, token)
)
