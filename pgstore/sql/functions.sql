-- functions.sql: the server-side functions of the lock table (CreateTable creates or replaces
-- them, in the table's schema, named after the table). Each operation that changes a name's
-- holders or queue is one call of one of them — one statement, one round trip — and runs as
-- one transaction that first locks the name's row (lock): the changes of one name happen one
-- at a time, and each statement inside sees what the one before committed (read committed).
-- Time is the database's: now(), the start of the calling statement, for leases a caller
-- asked for; clock_timestamp(), after the name's row is locked, for a lease handed over to a
-- waiter, so that it never starts before the waiter's last request.
--
-- The four that callers call run with enable_bitmapscan off: each grant inserts a holder's
-- row and each release deletes it, and a bitmap scan of a name taken thousands of times in a
-- row walks every dead index entry of it, until autovacuum, where a plain index scan marks
-- them dead once and skips them after (acquire + release ≈ 0.27 ms against ≈ 1.1–1.6 ms in
-- BenchmarkConformance, whose one name is taken some 10,000 times).
--
-- Statements are separated by lines of ";;".

-- lock: lock the name's row — made first when p_make and there is none — and delete the
-- name's dead rows (leases and places that ran out). Returns the name's last fence, or NULL
-- when it has no row and p_make is false.
CREATE OR REPLACE FUNCTION {{lock}}(p_name text, p_now timestamptz, p_make boolean) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_last bigint;
BEGIN
    FOR i IN 1 .. 3 LOOP
        SELECT l.fence INTO v_last FROM {{table}} AS l WHERE l.name = p_name AND l.token = '' FOR UPDATE;
        IF FOUND THEN
            DELETE FROM {{table}} AS l WHERE l.name = p_name AND l.token <> '' AND l.expires_at <= p_now;
            RETURN v_last;
        END IF;
        IF NOT p_make THEN
            RETURN NULL;
        END IF;
        INSERT INTO {{table}} (name, token, fence, expires_at, acquired_at)
        VALUES (p_name, '', 0, p_now, p_now) ON CONFLICT DO NOTHING;
    END LOOP;
    -- Only under repeatable read or serializable, where a row made by a transaction that
    -- committed after ours began stays out of sight: try the statement again.
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = 'guard: the name''s row is out of sight';
END
$fn$;
;;
-- check: whether p_token may take the name now, the name's row locked by lock: own is the
-- fence of its live hold when it holds it already; otherwise ok says whether it fits beside
-- the holders (a kept window counts as one) with no waiter before it, and when not,
-- remaining is how long the name stays unavailable to it, in µs.
CREATE OR REPLACE FUNCTION {{check}}(p_name text, p_token text, p_shared boolean, p_limit integer,
    p_now timestamptz, OUT own bigint, OUT ok boolean, OUT remaining bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_n integer;
    v_excl boolean;
    v_first timestamptz;
    v_last timestamptz;
    v_head text;
    v_head_end timestamptz;
    v_until timestamptz;
BEGIN
    remaining := 0;
    SELECT l.fence INTO own FROM {{table}} AS l
    WHERE l.name = p_name AND l.token = p_token AND l.token <> '' AND NOT l.waiting AND NOT l.kept;
    ok := own IS NOT NULL;
    IF ok THEN
        RETURN;
    END IF;
    SELECT count(*), coalesce(bool_or(NOT l.shared), false), min(l.expires_at), max(l.expires_at)
    INTO v_n, v_excl, v_first, v_last
    FROM {{table}} AS l WHERE l.name = p_name AND l.token <> '' AND NOT l.waiting;
    SELECT l.token, l.expires_at INTO v_head, v_head_end FROM {{table}} AS l
    WHERE l.name = p_name AND l.waiting ORDER BY l.fence LIMIT 1;
    ok := CASE WHEN p_shared THEN NOT v_excl AND (p_limit <= 0 OR v_n < p_limit) ELSE v_n = 0 END
          AND (v_head IS NULL OR v_head = p_token);
    IF ok THEN
        RETURN;
    END IF;
    IF NOT p_shared OR v_excl THEN
        v_until := v_last;
    ELSIF p_limit > 0 AND v_n >= p_limit THEN
        v_until := v_first;
    END IF;
    remaining := greatest(coalesce(floor(extract(epoch FROM v_until - p_now) * 1000000)::bigint, 0), 0);
    IF remaining = 0 AND v_head IS NOT NULL AND v_head <> p_token THEN
        -- Free for it, but a waiter comes first: no sooner than that one takes it or goes.
        remaining := greatest(floor(extract(epoch FROM v_head_end - p_now) * 1000000)::bigint, 0);
    END IF;
END
$fn$;
;;
-- grant: give the name to p_token with a new fence (the name's row locked by lock): the
-- name's last fence + 1, but never less than the clock in µs, so that a name whose row was
-- deleted starts again above every fence it gave. Returns the fence.
CREATE OR REPLACE FUNCTION {{grant}}(p_name text, p_token text, p_ttl bigint, p_instance text,
    p_label text, p_value text, p_shared boolean, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_fence bigint;
    v_ends timestamptz := p_now + p_ttl * interval '1 microsecond';
BEGIN
    UPDATE {{table}} AS l
    SET fence = greatest(l.fence + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint),
        expires_at = greatest(l.expires_at, v_ends), acquired_at = p_now,
        instance = p_instance, label = p_label, value = p_value
    WHERE l.name = p_name AND l.token = ''
    RETURNING l.fence INTO v_fence;
    INSERT INTO {{table}} AS l (name, token, fence, expires_at, acquired_at, instance, label, value, shared)
    VALUES (p_name, p_token, v_fence, v_ends, p_now, p_instance, p_label, p_value, p_shared)
    ON CONFLICT (name, token) DO UPDATE SET
        fence = excluded.fence, expires_at = excluded.expires_at, acquired_at = excluded.acquired_at,
        instance = excluded.instance, label = excluded.label, value = excluded.value,
        shared = excluded.shared, kept = false, waiting = false, lim = 0, lease = 0, attempt = 0;
    RETURN v_fence;
END
$fn$;
;;
-- hand: after holders went (the name's row locked by lock), give the name to the first live
-- waiters while they fit — one exclusive waiter, or shared ones up to their limits — each
-- with its own fence and a lease of what it asked for or its place, whichever is shorter,
-- and tell each in a notification: '>' fence ':' lease µs ':' attempt ':' the waiter's
-- token's length ':' the waiter's token, then p_payload (who released, and the name; see
-- payload in pgstore.go). When it hands to nobody, it sends p_payload alone if p_notify.
-- Returns how many it handed the name to.
CREATE OR REPLACE FUNCTION {{hand}}(p_name text, p_payload text, p_notify boolean) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_channel text := {{channel}};
    v_n integer;
    v_excl boolean;
    v_last bigint;
    v_granted integer := 0;
    w record;
BEGIN
    SELECT count(*), coalesce(bool_or(NOT l.shared), false) INTO v_n, v_excl
    FROM {{table}} AS l WHERE l.name = p_name AND l.token <> '' AND NOT l.waiting AND l.expires_at > now();
    SELECT l.fence INTO v_last FROM {{table}} AS l WHERE l.name = p_name AND l.token = '';
    FOR w IN SELECT l.token, l.shared, l.lim, l.lease, l.attempt, l.instance, l.label, l.value
             FROM {{table}} AS l
             WHERE l.name = p_name AND l.waiting AND l.expires_at > v_now ORDER BY l.fence LOOP
        EXIT WHEN v_excl OR (NOT w.shared AND v_n > 0) OR (w.shared AND w.lim > 0 AND v_n >= w.lim);
        v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
        UPDATE {{table}} AS l
        SET waiting = false, fence = v_last, expires_at = v_now + w.lease * interval '1 microsecond',
            acquired_at = v_now, lim = 0, lease = 0, attempt = 0
        WHERE l.name = p_name AND l.token = w.token;
        UPDATE {{table}} AS l
        SET fence = v_last, expires_at = greatest(l.expires_at, v_now + w.lease * interval '1 microsecond'),
            acquired_at = v_now, instance = w.instance, label = w.label, value = w.value
        WHERE l.name = p_name AND l.token = '';
        PERFORM pg_notify(v_channel, CASE
            WHEN octet_length(w.token) + octet_length(p_payload) <= 7900
            THEN '>' || v_last || ':' || w.lease || ':' || w.attempt || ':' || octet_length(w.token) || ':' || w.token || p_payload
            ELSE p_payload END);
        v_n := v_n + 1;
        v_excl := NOT w.shared;
        v_granted := v_granted + 1;
    END LOOP;
    IF v_granted = 0 AND p_notify THEN
        PERFORM pg_notify(v_channel, p_payload);
    END IF;
    RETURN v_granted;
END
$fn$;
;;
-- acquire: one attempt to take p_name for p_token (Store.Acquire). A retry by the token that
-- holds it renews its lease and keeps its fence. Otherwise it is granted when it fits beside
-- the holders and no live waiter comes before it; when not, and p_wait, p_token is queued
-- (or its place refreshed) for p_place µs. Returns whether it was granted, the fence, and
-- when busy how long the name stays unavailable to it and how long it keeps its place (0:
-- not queued), in µs.
CREATE OR REPLACE FUNCTION {{acquire}}(p_name text, p_token text, p_ttl bigint, p_instance text,
    p_label text, p_value text, p_shared boolean, p_limit integer, p_wait boolean, p_attempt integer,
    p_place bigint, OUT r_granted boolean, OUT r_fence bigint, OUT r_remaining bigint, OUT r_queued bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $fn$
DECLARE
    v_now timestamptz := now();
    v_place timestamptz := now() + p_place * interval '1 microsecond';
    v_last bigint;
    c record;
BEGIN
    r_fence := 0;
    r_queued := 0;
    v_last := {{lock}}(p_name, v_now, true);
    SELECT * INTO c FROM {{check}}(p_name, p_token, p_shared, p_limit, v_now);
    r_granted := c.ok;
    r_remaining := c.remaining;
    IF c.own IS NOT NULL THEN
        UPDATE {{table}} AS l SET expires_at = v_now + p_ttl * interval '1 microsecond'
        WHERE l.name = p_name AND l.token = p_token;
        r_fence := c.own;
        RETURN;
    END IF;
    IF c.ok THEN
        r_fence := {{grant}}(p_name, p_token, p_ttl, p_instance, p_label, p_value, p_shared, v_now);
        RETURN;
    END IF;
    IF NOT p_wait THEN
        RETURN;
    END IF;
    UPDATE {{table}} AS l
    SET expires_at = v_place, attempt = p_attempt, lease = least(p_ttl, p_place), shared = p_shared,
        lim = p_limit, instance = p_instance, label = p_label, value = p_value
    WHERE l.name = p_name AND l.token = p_token AND l.waiting;
    IF NOT FOUND THEN
        -- A new waiter: its place is the name's next number.
        UPDATE {{table}} AS l SET fence = l.fence + 1, expires_at = greatest(l.expires_at, v_place)
        WHERE l.name = p_name AND l.token = ''
        RETURNING l.fence INTO v_last;
        INSERT INTO {{table}} (name, token, fence, expires_at, acquired_at, instance, label, value,
                               shared, waiting, lim, lease, attempt)
        VALUES (p_name, p_token, v_last, v_place, v_now, p_instance, p_label, p_value,
                p_shared, true, p_limit, least(p_ttl, p_place), p_attempt)
        ON CONFLICT DO NOTHING;
    END IF;
    IF FOUND THEN
        r_queued := p_place;
    END IF;
END
$fn$;
;;
-- acquire_all: one attempt to take every name of the arrays (Store.AcquireAll), all or none:
-- the names' rows are locked in byte order, so that two calls never wait for each other in a
-- circle; then each name is checked as acquire checks it, and only when all may be taken is
-- each taken (or, for a token that holds it already, renewed). Nobody is queued. Returns the
-- fences, in the arrays' order; or, when a name may not be taken, its index (from 1) and how
-- long it stays unavailable, in µs.
CREATE OR REPLACE FUNCTION {{acquire_all}}(p_names text[], p_tokens text[], p_ttls bigint[],
    p_instances text[], p_labels text[], p_values text[], p_shared boolean[], p_limits integer[],
    OUT r_fences bigint[], OUT r_busy integer, OUT r_remaining bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $fn$
DECLARE
    v_now timestamptz := now();
    v_own bigint[];
    i integer;
    c record;
BEGIN
    r_busy := 0;
    r_remaining := 0;
    FOR i IN SELECT u.o FROM unnest(p_names) WITH ORDINALITY AS u (name, o) ORDER BY u.name COLLATE "C", u.o LOOP
        PERFORM {{lock}}(p_names[i], v_now, true);
    END LOOP;
    v_own := array_fill(0::bigint, ARRAY[cardinality(p_names)]);
    FOR i IN 1 .. cardinality(p_names) LOOP
        SELECT * INTO c FROM {{check}}(p_names[i], p_tokens[i], p_shared[i], p_limits[i], v_now);
        IF NOT c.ok THEN
            r_busy := i;
            r_remaining := c.remaining;
            RETURN;
        END IF;
        v_own[i] := coalesce(c.own, 0);
    END LOOP;
    r_fences := v_own;
    FOR i IN 1 .. cardinality(p_names) LOOP
        IF v_own[i] <> 0 THEN
            UPDATE {{table}} AS l SET expires_at = v_now + p_ttls[i] * interval '1 microsecond'
            WHERE l.name = p_names[i] AND l.token = p_tokens[i];
        ELSE
            r_fences[i] := {{grant}}(p_names[i], p_tokens[i], p_ttls[i], p_instances[i], p_labels[i],
                                     p_values[i], p_shared[i], v_now);
        END IF;
    END LOOP;
END
$fn$;
;;
-- release: give p_name up if p_token holds it (Store.Release). With p_keep > 0 the hold stays
-- for p_keep µs, kept: no token extends or releases it, and it still counts as a holder; the
-- listeners are told (p_payload), so that waiters learn when the window ends. Otherwise the
-- hold goes and hand passes what it frees to the first waiters. A token that waits instead of
-- holding leaves the queue, and the waiters after it may then fit. Returns 1 when released,
-- 2 when it left the queue, 0 when it neither held nor waited.
CREATE OR REPLACE FUNCTION {{release}}(p_name text, p_token text, p_keep bigint, p_payload text) RETURNS integer
LANGUAGE plpgsql SET enable_bitmapscan = off AS $fn$
DECLARE
    v_now timestamptz := now();
    v_waiting boolean;
BEGIN
    IF {{lock}}(p_name, v_now, false) IS NULL THEN
        RETURN 0;
    END IF;
    IF p_keep > 0 THEN
        UPDATE {{table}} AS l SET kept = true, expires_at = v_now + p_keep * interval '1 microsecond'
        WHERE l.name = p_name AND l.token = p_token AND l.token <> '' AND NOT l.waiting AND NOT l.kept;
        IF FOUND THEN
            PERFORM pg_notify({{channel}}, p_payload);
            RETURN 1;
        END IF;
    END IF;
    DELETE FROM {{table}} AS l WHERE l.name = p_name AND l.token = p_token AND l.token <> '' AND NOT l.kept
    RETURNING l.waiting INTO v_waiting;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM {{hand}}(p_name, p_payload, NOT v_waiting);
    RETURN CASE WHEN v_waiting THEN 2 ELSE 1 END;
END
$fn$;
;;
-- force_release: free p_name's holder with fence p_fence, or every holder when p_fence is 0,
-- kept windows included (Inspector.ForceRelease), and hand what that frees to the first
-- waiters. Returns the fence found — the one released, or the newest holder's when none has
-- p_fence; 0 when the name is free — and whether it released anything.
CREATE OR REPLACE FUNCTION {{force_release}}(p_name text, p_fence bigint, p_payload text,
    OUT r_found bigint, OUT r_released boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $fn$
DECLARE
    v_has boolean;
BEGIN
    r_found := 0;
    r_released := false;
    IF {{lock}}(p_name, now(), false) IS NULL THEN
        RETURN;
    END IF;
    SELECT max(l.fence), coalesce(bool_or(l.fence = p_fence), false) INTO r_found, v_has
    FROM {{table}} AS l WHERE l.name = p_name AND l.token <> '' AND NOT l.waiting;
    IF r_found IS NULL THEN
        r_found := 0;
        RETURN;
    END IF;
    IF p_fence <> 0 AND NOT v_has THEN
        RETURN;
    END IF;
    DELETE FROM {{table}} AS l
    WHERE l.name = p_name AND l.token <> '' AND NOT l.waiting AND (p_fence = 0 OR l.fence = p_fence);
    PERFORM {{hand}}(p_name, p_payload, true);
    IF p_fence <> 0 THEN
        r_found := p_fence;
    END IF;
    r_released := true;
END
$fn$
