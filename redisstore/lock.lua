-- lock.lua: what the other scripts share; the Store puts it in front of each of them.
--
-- A lock named n lives in keys that share the Cluster hash tag {n}:
--   K[1]  <prefix>{n}          hash: token, fence, instance, label, value, since (server ms):
--                              the exclusive holder; its expiry is the lease. token "" while
--                              kept for a MinHold window.
--   K[2]  <prefix>{n}:fence    string: the last fence given
--   K[3]  <prefix>{n}:queue    sorted set: waiting tokens, by arrival (server time, µs)
--   K[4]  <prefix>{n}:waiters  hash: token -> JSON {e: place expires (ms), p: place (ms),
--                              t: lease asked for (ms), i: instance, l: label, v: value,
--                              a: the attempt that last refreshed the place,
--                              s: true for a shared request, n: its limit (0: none)}
--   K[5]  <prefix>{n}:shared   sorted set: the shared holders, by the end of their lease
--                              (server ms). A holder is its token, or "\0" .. its fence while
--                              kept for a MinHold window: no token matches that.
--   K[6]  <prefix>{n}:holders  hash: shared holder -> JSON {f: fence, i: instance, l: label,
--                              v: value, s: since (server ms)}
-- K[5] and K[6] live as long as their longest lease. An exclusive holder and shared holders
-- never hold n at once.
-- K is KEYS, or — in acquire_all.lua — the keys of the name at hand.
-- Writes after TIME need effects replication, the default since Redis 5.
local K = KEYS

-- now_us returns the server's time in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- first_waiter returns the first waiter whose place has not expired, and its data, dropping
-- the expired ones before it; nil when nobody waits. now_ms is a number or a function: the
-- clock is read only when someone waits.
local function first_waiter(now_ms)
  while true do
    local head = redis.call('ZRANGE', K[3], 0, 0)[1]
    if not head then
      return nil
    end
    if type(now_ms) == 'function' then
      now_ms = now_ms()
    end
    local raw = redis.call('HGET', K[4], head)
    if raw then
      local w = cjson.decode(raw)
      if w.e > now_ms then
        return head, w
      end
    end
    redis.call('ZREM', K[3], head)
    redis.call('HDEL', K[4], head)
  end
end

-- dequeue takes token out of the queue; it reports whether it was there.
local function dequeue(token)
  redis.call('HDEL', K[4], token)
  return redis.call('ZREM', K[3], token) == 1
end

-- fence_reply returns a fence for the client: a number, which reaches it as an integer
-- without a string to parse, as long as a Lua number holds it exactly; else the string.
local function fence_reply(fence)
  local n = tonumber(fence)
  if n < 9007199254740000 then
    return n
  end
  return fence
end

-- fence_less compares two fences given in decimal, exactly.
local function fence_less(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- shared_count drops the shared holders whose lease ended by now_ms, and returns how many
-- are left (kept windows included).
local function shared_count(now_ms)
  if redis.call('EXISTS', K[5]) == 0 then
    return 0
  end
  local gone = redis.call('ZRANGEBYSCORE', K[5], '-inf', now_ms)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', K[5], '-inf', now_ms)
    for i = 1, #gone, 500 do
      redis.call('HDEL', K[6], unpack(gone, i, math.min(i + 499, #gone)))
    end
  end
  return redis.call('ZCARD', K[5])
end

-- fits reports whether a request — shared with limit (0: none), or exclusive — could hold the
-- name now, as far as its holders go.
local function fits(shared, limit, now_ms)
  if redis.call('EXISTS', K[1]) == 1 then
    return false
  end
  local n = shared_count(now_ms)
  if shared then
    return limit <= 0 or n < limit
  end
  return n == 0
end

-- outlive makes the shared holders' keys live at least ttl ms more.
local function outlive(ttl)
  if redis.call('PTTL', K[5]) < ttl then
    redis.call('PEXPIRE', K[5], ttl)
    redis.call('PEXPIRE', K[6], ttl)
  end
end

-- shared_fence returns the fence of a shared holder, a string.
local function shared_fence(member)
  return cjson.decode(redis.call('HGET', K[6], member)).f
end

-- grant gives the lock to token — shared or exclusive — for a lease of ttl ms and returns the
-- new fence, a string.
--
-- The fence is max(last fence + 1, the server's time in microseconds). The fence key keeps
-- the count while the name is in use (it outlives each lease by `retention` ms, and a grant
-- never shortens it); when it is gone — expired, evicted, or lost with a restart — the
-- server's clock still puts the next fence above every earlier one, because each of those was
-- at most its own grant time in microseconds (plus the grants that came within the same
-- microseconds). Lua numbers are doubles, exact below 2^53 (the clock gets there in the year
-- 2255): a fence key above that counts on with INCR, exact in 64 bits.
local function grant(token, ttl, instance, label, value, shared, retention, now)
  local fence
  local life = ttl + retention
  local longer = redis.call('PTTL', K[2]) > life
  local last = tonumber(redis.call('GET', K[2]) or '0')
  if last < 9007199254740000 then
    fence = string.format('%.0f', math.max(last + 1, now))
    if longer then
      redis.call('SET', K[2], fence, 'KEEPTTL')
    else
      redis.call('SET', K[2], fence, 'PX', life)
    end
  else
    redis.call('INCR', K[2])
    if not longer then
      redis.call('PEXPIRE', K[2], life)
    end
    fence = redis.call('GET', K[2])
  end
  local now_ms = math.floor(now / 1000)
  local since = string.format('%.0f', now_ms)
  if shared then
    redis.call('ZADD', K[5], now_ms + ttl, token)
    redis.call('HSET', K[6], token, cjson.encode({f = fence, i = instance, l = label, v = value, s = since}))
    outlive(ttl)
  else
    redis.call('HSET', K[1], 'token', token, 'fence', fence, 'instance', instance,
      'label', label, 'value', value, 'since', since)
    redis.call('PEXPIRE', K[1], ttl)
  end
  return fence
end

-- hand_over gives the name to its first live waiters while they fit — one, or several shared
-- ones — under their tokens, and publishes "released\nnext\nfence\nlease\nattempt" on channel
-- for each, so that the waiter's Guard hands it the lock, counting its lease from when that
-- attempt was sent (lease in milliseconds: the other Guards' waiters ask again when it could
-- run out). It returns {next, fence, lease, attempt, ...}: four entries per waiter handed.
-- A lease is the one the waiter asked for, but no longer than its place in the queue: a
-- waiter that died while queued holds the name no longer than that, and a live one claims the
-- rest of its lease at once. With nobody handed it publishes nothing: the waiters keep their
-- places and ask again in time.
local function hand_over(channel, released, retention)
  local now
  local function clock()
    now = now_us()
    return math.floor(now / 1000)
  end
  local handed = {}
  while true do
    local next, w = first_waiter(now and math.floor(now / 1000) or clock)
    if not next then
      break
    end
    local shared = w.s == true
    if not fits(shared, w.n or 0, math.floor(now / 1000)) then
      break
    end
    dequeue(next)
    local lease = math.min(w.t, w.p)
    local fence = grant(next, lease, w.i, w.l, w.v or '', shared, retention, now)
    local attempt = w.a or 0
    redis.call('PUBLISH', channel, released .. '\n' .. next .. '\n' .. fence .. '\n' .. lease .. '\n' .. attempt)
    handed[#handed + 1] = next
    handed[#handed + 1] = fence_reply(fence)
    handed[#handed + 1] = lease
    handed[#handed + 1] = attempt
    if not shared then
      break -- an exclusive holder leaves room for nobody: no need to look at the next one
    end
  end
  return handed
end

-- handed_reply returns a release's reply after a hand-over: {1, next, fence, lease, attempt,
-- ...}, or 1 when nobody was handed the name.
local function handed_reply(handed)
  if #handed == 0 then
    return 1
  end
  table.insert(handed, 1, 1)
  return handed
end
