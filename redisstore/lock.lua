-- lock.lua: what the other scripts share; the Store puts it in front of each of them.
--
-- A lock named n lives in keys that share the Cluster hash tag {n}:
--   KEYS[1]  <prefix>{n}          hash: token, fence, instance, label, since (server ms); its
--                                 expiry is the lease. token "" while kept for a MinHold window.
--   KEYS[2]  <prefix>{n}:fence    string: the last fence given
--   KEYS[3]  <prefix>{n}:queue    sorted set: waiting tokens, by arrival (server time, µs)
--   KEYS[4]  <prefix>{n}:waiters  hash: token -> JSON {e: place expires (ms), p: place (ms),
--                                 t: lease asked for (ms), i: instance, l: label}
-- Writes after TIME need effects replication, the default since Redis 5.

-- now_us returns the server's time in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- first_waiter returns the first waiter whose place has not expired, and its data, dropping
-- the expired ones before it; nil when nobody waits. now_ms is a function: the clock is read
-- only when someone waits.
local function first_waiter(now_ms)
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then
      return nil
    end
    if type(now_ms) == 'function' then
      now_ms = now_ms()
    end
    local raw = redis.call('HGET', KEYS[4], head)
    if raw then
      local w = cjson.decode(raw)
      if w.e > now_ms then
        return head, w
      end
    end
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
  end
end

-- dequeue takes token out of the queue; it reports whether it was there.
local function dequeue(token)
  redis.call('HDEL', KEYS[4], token)
  return redis.call('ZREM', KEYS[3], token) == 1
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

-- grant gives the lock to token for a lease of ttl ms and returns the new fence, a string.
--
-- The fence is max(last fence + 1, the server's time in microseconds). The fence key keeps
-- the count while the name is in use (it outlives each lease by `retention` ms); when it is
-- gone — expired, evicted, or lost with a restart — the server's clock still puts the next
-- fence above every earlier one, because each of those was at most its own grant time in
-- microseconds (plus the grants that came within the same microseconds). Lua numbers are
-- doubles, exact below 2^53 (the clock gets there in the year 2255): a fence key above that
-- counts on with INCR, exact in 64 bits.
local function grant(token, ttl, instance, label, retention, now)
  local fence
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if last < 9007199254740000 then
    fence = string.format('%.0f', math.max(last + 1, now))
    redis.call('SET', KEYS[2], fence, 'PX', ttl + retention)
  else
    redis.call('INCR', KEYS[2])
    redis.call('PEXPIRE', KEYS[2], ttl + retention)
    fence = redis.call('GET', KEYS[2])
  end
  redis.call('HSET', KEYS[1], 'token', token, 'fence', fence, 'instance', instance,
    'label', label, 'since', string.format('%.0f', math.floor(now / 1000)))
  redis.call('PEXPIRE', KEYS[1], ttl)
  return fence
end

-- hand_over gives the free name to its first live waiter, under the waiter's token, and
-- publishes "released\nnext\nfence" on channel so that the waiter's Guard hands it the lock;
-- it returns the waiter and the fence.
-- The lease is the one the waiter asked for, but no longer than its place in the queue: a
-- waiter that died while queued holds the name no longer than that, and a live one claims the
-- rest of its lease at once. With nobody waiting it publishes nothing: nobody listens.
local function hand_over(channel, released, retention)
  local now
  local next, w = first_waiter(function() now = now_us(); return math.floor(now / 1000) end)
  if not next then
    return
  end
  dequeue(next)
  local fence = grant(next, math.min(w.t, w.p), w.i, w.l, retention, now)
  redis.call('PUBLISH', channel, released .. '\n' .. next .. '\n' .. fence)
  return next, fence_reply(fence)
end

