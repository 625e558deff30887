package mysqlstore

// The stored procedures of the table (CreateTable creates them, in the table's schema, named
// after the table). Each operation that changes a name's holders or queue is one CALL of one
// of them — one statement, one round trip — which runs as one transaction at READ COMMITTED
// that first locks the name's row (lock): the changes of one name happen one at a time, each
// statement inside sees what the ones before committed, and no gap lock reaches other names.
// Time is the database's: UTC_TIMESTAMP(6) when the CALL starts.
//
// Waiting: MySQL cannot tell a waiter in another process that a name is free, so a queue that
// handed a freed name to its first waiter would leave the name idle until that waiter next
// asks (up to a second of backoff). Instead an exclusive request that waits leaves a mark, a
// waiter's row, which it refreshes with each request it sends; a shared request is not granted
// while such a mark is live, so that readers and permits never starve a writer. Among
// requests of one kind, and for an exclusive one, whoever asks first after a release gets the
// name, as on a store without a queue.
//
// The helpers (lock, check, grant) run inside the transaction of the procedure that
// calls them; only acquire, acquire_all, release and force_release start one, and roll it
// back on any error before they pass it on.
//
// Each procedure's COMMENT carries a digest of its text, so that CreateTable replaces a
// procedure only when this version's differs (MySQL has no CREATE OR REPLACE PROCEDURE, and
// between a DROP and a CREATE a CALL fails).
var procedures = []struct{ op, params, body string }{
	// lock: lock the name's row — made first when p_make and there is none — and delete the
	// name's dead rows (leases and places that ran out). r_last is the name's last number, or
	// NULL when it has no row and p_make is false.
	{"lock", "IN p_name VARBINARY(1024), IN p_now DATETIME(6), IN p_make BOOL, OUT r_last BIGINT UNSIGNED", `
BEGIN
  DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
  SET r_last = NULL;
  IF p_make THEN
    INSERT INTO {table} (name, token, fence, expires_at, acquired_at, instance, label)
    VALUES (p_name, X'', 0, p_now, p_now, '', '') ON DUPLICATE KEY UPDATE fence = fence;
  END IF;
  SELECT fence INTO r_last FROM {table} WHERE name = p_name AND token = X'' FOR UPDATE;
  IF r_last IS NOT NULL THEN
    DELETE FROM {table} WHERE name = p_name AND token <> X'' AND expires_at <= p_now;
  END IF;
END`},
	// check: whether p_token may take the name now, its row locked: r_own is the fence of its
	// live hold when it holds it already; otherwise r_ok says whether it fits beside the
	// holders (a kept window counts as one) — and, for a shared request, no exclusive request
	// waits — and when not, r_remaining is how long the name stays unavailable to it, in µs.
	{"check", "IN p_name VARBINARY(1024), IN p_token VARBINARY(255), IN p_shared BOOL, IN p_limit INT, " +
		"IN p_now DATETIME(6), OUT r_own BIGINT UNSIGNED, OUT r_ok BOOL, OUT r_remaining BIGINT", `
BEGIN
  DECLARE v_n INT;
  DECLARE v_excl BOOL;
  DECLARE v_first, v_last, v_until, v_head_end DATETIME(6);
  DECLARE v_head VARBINARY(255);
  SET r_remaining = 0;
  SET r_own = (SELECT fence FROM {table}
               WHERE name = p_name AND token = p_token AND token <> X'' AND NOT waiting AND NOT kept);
  SET r_ok = r_own IS NOT NULL;
  IF NOT r_ok THEN
    SELECT COUNT(*), COALESCE(MAX(NOT shared), 0), MIN(expires_at), MAX(expires_at)
    INTO v_n, v_excl, v_first, v_last
    FROM {table} WHERE name = p_name AND token <> X'' AND NOT waiting;
    IF p_shared THEN
      SET v_head = (SELECT token FROM {table} WHERE name = p_name AND waiting ORDER BY fence LIMIT 1);
      SET v_head_end = (SELECT MAX(expires_at) FROM {table} WHERE name = p_name AND waiting);
    END IF;
    SET r_ok = IF(p_shared, NOT v_excl AND (p_limit <= 0 OR v_n < p_limit) AND v_head IS NULL, v_n = 0);
    IF NOT r_ok THEN
      IF NOT p_shared OR v_excl THEN
        SET v_until = v_last;
      ELSEIF p_limit > 0 AND v_n >= p_limit THEN
        SET v_until = v_first;
      END IF;
      SET r_remaining = GREATEST(COALESCE(TIMESTAMPDIFF(MICROSECOND, p_now, v_until), 0), 0);
      IF r_remaining = 0 AND v_head IS NOT NULL THEN
        -- Free for it, but a writer waits: no sooner than the writers take it or go.
        SET r_remaining = GREATEST(TIMESTAMPDIFF(MICROSECOND, p_now, v_head_end), 0);
      END IF;
    END IF;
  END IF;
END`},
	// grant: give the name to p_token with a new fence, its row locked: the name's last
	// number + 1, but never less than the clock in µs, so that a name whose row was deleted
	// starts again above every fence it gave.
	{"grant", "IN p_name VARBINARY(1024), IN p_token VARBINARY(255), IN p_ttl BIGINT, " +
		"IN p_instance VARCHAR(255) CHARSET utf8mb4, IN p_label VARCHAR(255) CHARSET utf8mb4, " +
		"IN p_value VARCHAR(255) CHARSET utf8mb4, IN p_shared BOOL, IN p_now DATETIME(6), OUT r_fence BIGINT UNSIGNED", `
BEGIN
  DECLARE v_ends DATETIME(6) DEFAULT p_now + INTERVAL p_ttl MICROSECOND;
  SELECT GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', p_now)) INTO r_fence
  FROM {table} WHERE name = p_name AND token = X'';
  UPDATE {table} SET fence = r_fence, expires_at = GREATEST(expires_at, v_ends), acquired_at = p_now,
    instance = p_instance, label = p_label, value = p_value
  WHERE name = p_name AND token = X'';
  DELETE FROM {table} WHERE name = p_name AND token = p_token;
  INSERT INTO {table} (name, token, fence, expires_at, acquired_at, instance, label, value, shared)
  VALUES (p_name, p_token, r_fence, v_ends, p_now, p_instance, p_label, p_value, p_shared);
END`},
	// acquire: one attempt to take p_name for p_token (Store.Acquire). A retry by the token
	// that holds it renews its lease and keeps its fence. Otherwise it is granted when it fits
	// (check); when not, and it is exclusive and p_wait, p_token marks its wait (or refreshes
	// its mark) for p_place µs. Answers one row: granted, the fence, and when busy how long
	// the name stays unavailable, in µs.
	{"acquire", "IN p_name VARBINARY(1024), IN p_token VARBINARY(255), IN p_ttl BIGINT, " +
		"IN p_instance VARCHAR(255) CHARSET utf8mb4, IN p_label VARCHAR(255) CHARSET utf8mb4, " +
		"IN p_value VARCHAR(255) CHARSET utf8mb4, IN p_shared BOOL, IN p_limit INT, IN p_wait BOOL, " +
		"IN p_place BIGINT", `
BEGIN
  DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
  DECLARE v_last, v_own, v_fence BIGINT UNSIGNED;
  DECLARE v_ok BOOL;
  DECLARE v_remaining BIGINT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL {lock}(p_name, v_now, TRUE, v_last);
  CALL {check}(p_name, p_token, p_shared, p_limit, v_now, v_own, v_ok, v_remaining);
  IF v_own IS NOT NULL THEN
    UPDATE {table} SET expires_at = v_now + INTERVAL p_ttl MICROSECOND WHERE name = p_name AND token = p_token;
    SET v_fence = v_own;
  ELSEIF v_ok THEN
    CALL {grant}(p_name, p_token, p_ttl, p_instance, p_label, p_value, p_shared, v_now, v_fence);
  ELSEIF p_wait AND NOT p_shared THEN
    IF EXISTS (SELECT 1 FROM {table} WHERE name = p_name AND token = p_token AND waiting) THEN
      UPDATE {table} SET expires_at = v_now + INTERVAL p_place MICROSECOND
      WHERE name = p_name AND token = p_token;
    ELSEIF NOT EXISTS (SELECT 1 FROM {table} WHERE name = p_name AND token = p_token) THEN
      -- A new mark: its number is the name's next.
      UPDATE {table} SET fence = fence + 1, expires_at = GREATEST(expires_at, v_now + INTERVAL p_place MICROSECOND)
      WHERE name = p_name AND token = X'';
      INSERT INTO {table} (name, token, fence, expires_at, acquired_at, instance, label, value, waiting)
      VALUES (p_name, p_token, v_last + 1, v_now + INTERVAL p_place MICROSECOND, v_now, p_instance, p_label, p_value, 1);
    END IF;
  END IF;
  COMMIT;
  SELECT v_own IS NOT NULL OR v_ok, COALESCE(v_fence, 0), v_remaining;
END`},
	// acquire_all: one attempt to take every name of p_reqs (Store.AcquireAll), all or none.
	// p_reqs is a JSON array, sorted by name, of objects {n: name, t: token, i: instance,
	// b: label, v: value (each in hexadecimal), l: lease in µs, s: shared (0 or 1), m: limit}.
	// The names' rows are locked in that order, so that two calls never wait for each other
	// in a circle; then each name is checked as acquire checks it, and only when every one
	// may be taken is each taken (or, for a token that holds it already, renewed). Nobody is
	// marked. Answers one row: the fences, comma-separated, in p_reqs' order; the index (from
	// 1) of a name that may not be taken, or 0; and how long it stays unavailable, in µs.
	{"acquire_all", "IN p_reqs LONGTEXT", `
BEGIN
  DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
  DECLARE v_count INT DEFAULT JSON_LENGTH(p_reqs);
  DECLARE i INT DEFAULT 0;
  DECLARE v_last, v_own, v_fence BIGINT UNSIGNED;
  DECLARE v_ok BOOL;
  DECLARE v_remaining BIGINT;
  DECLARE v_busy INT DEFAULT 0;
  DECLARE v_busy_remaining BIGINT DEFAULT 0;
  DECLARE v_fences LONGTEXT DEFAULT '';
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  WHILE i < v_count DO
    CALL {lock}({req_n}, v_now, TRUE, v_last);
    SET i = i + 1;
  END WHILE;
  SET i = 0;
  WHILE i < v_count AND v_busy = 0 DO
    CALL {check}({req_n}, {req_t}, {req_s}, {req_m}, v_now, v_own, v_ok, v_remaining);
    IF NOT v_ok THEN
      SET v_busy = i + 1, v_busy_remaining = v_remaining;
    END IF;
    SET i = i + 1;
  END WHILE;
  SET i = 0;
  WHILE i < v_count AND v_busy = 0 DO
    CALL {check}({req_n}, {req_t}, {req_s}, {req_m}, v_now, v_own, v_ok, v_remaining);
    IF v_own IS NOT NULL THEN
      UPDATE {table} SET expires_at = v_now + INTERVAL {req_l} MICROSECOND WHERE name = {req_n} AND token = {req_t};
      SET v_fence = v_own;
    ELSE
      CALL {grant}({req_n}, {req_t}, {req_l}, {req_i}, {req_b}, {req_v}, {req_s}, v_now, v_fence);
    END IF;
    SET v_fences = CONCAT(v_fences, IF(i > 0, ',', ''), v_fence);
    SET i = i + 1;
  END WHILE;
  COMMIT;
  SELECT v_fences, v_busy, v_busy_remaining;
END`},
	// release: give p_name up if p_token holds it (Store.Release). With p_keep > 0 the hold
	// stays for p_keep µs, kept: no token extends or releases it, and it still counts as a
	// holder. Otherwise the hold goes. A token that waits instead of holding takes its mark
	// away. Answers 1 when released, 2 when it took a mark away, 0 when it neither held nor
	// waited.
	{"release", "IN p_name VARBINARY(1024), IN p_token VARBINARY(255), IN p_keep BIGINT", `
BEGIN
  DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
  DECLARE v_last BIGINT UNSIGNED;
  DECLARE v_waiting BOOL;
  DECLARE v_done INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL {lock}(p_name, v_now, FALSE, v_last);
  IF v_last IS NOT NULL AND p_token <> X'' THEN
    SET v_waiting = (SELECT waiting FROM {table} WHERE name = p_name AND token = p_token AND NOT kept);
    IF v_waiting IS NOT NULL THEN
      IF p_keep > 0 AND NOT v_waiting THEN
        UPDATE {table} SET kept = 1, expires_at = v_now + INTERVAL p_keep MICROSECOND
        WHERE name = p_name AND token = p_token;
        SET v_done = 1;
      ELSE
        DELETE FROM {table} WHERE name = p_name AND token = p_token;
        SET v_done = IF(v_waiting, 2, 1);
      END IF;
    END IF;
  END IF;
  COMMIT;
  SELECT v_done;
END`},
	// force_release: free p_name's holder with fence p_fence, or every holder when p_fence is
	// 0, kept windows included (Inspector.ForceRelease). Answers the fence found — the one released, or the newest holder's when
	// none has p_fence; 0 when the name is free — and whether it released anything.
	{"force_release", "IN p_name VARBINARY(1024), IN p_fence BIGINT UNSIGNED", `
BEGIN
  DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
  DECLARE v_last, v_newest BIGINT UNSIGNED;
  DECLARE v_has BOOL DEFAULT 0;
  DECLARE v_found BIGINT UNSIGNED DEFAULT 0;
  DECLARE v_released BOOL DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL {lock}(p_name, v_now, FALSE, v_last);
  IF v_last IS NOT NULL THEN
    SELECT MAX(fence), COALESCE(MAX(fence = p_fence), 0) INTO v_newest, v_has
    FROM {table} WHERE name = p_name AND token <> X'' AND NOT waiting;
    IF v_newest IS NOT NULL THEN
      SET v_found = v_newest;
      IF p_fence = 0 OR v_has THEN
        DELETE FROM {table}
        WHERE name = p_name AND token <> X'' AND NOT waiting AND (p_fence = 0 OR fence = p_fence);
        SET v_released = 1;
        IF p_fence <> 0 THEN
          SET v_found = p_fence;
        END IF;
      END IF;
    END IF;
  END IF;
  COMMIT;
  SELECT v_found, v_released;
END`},
}

// reqField extracts field f of the request at index i of acquire_all's p_reqs: a hexadecimal
// field as the bytes it stands for (text ones as utf8mb4), a number as a number.
var reqFields = map[string]string{
	"{req_n}": "UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].n'))))",
	"{req_t}": "UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].t'))))",
	"{req_i}": "CONVERT(UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].i')))) USING utf8mb4)",
	"{req_b}": "CONVERT(UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].b')))) USING utf8mb4)",
	"{req_v}": "CONVERT(UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].v')))) USING utf8mb4)",
	"{req_l}": "CAST(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].l')) AS SIGNED)",
	"{req_s}": "CAST(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].s')) AS SIGNED)",
	"{req_m}": "CAST(JSON_EXTRACT(p_reqs, CONCAT('$[', i, '].m')) AS SIGNED)",
}
