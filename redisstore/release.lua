-- release.lua: give a lock up — exclusive or shared — for its holder only (after lock.lua).
--
-- ARGV[1]  the holder's token
-- ARGV[2]  keep: milliseconds the name must stay taken (the rest of a MinHold window), or 0
-- ARGV[3]  the release channel <prefix>{n}:released
-- ARGV[4]  how long the fence key outlives a lease, in milliseconds
--
-- Returns 1 after either keeping the holder's place taken for keep under no token — the
-- exclusive lock under the token "", a shared hold as "\0" .. fence — so that a renewal of
-- ARGV[1] still on the wire cannot shorten the window, and telling the waiters, who learn when
-- the window ends; or freeing it. Returns {1, next, fence, lease, attempt, ...} after freeing
-- it and handing it to the first live waiters that fit (see hand_over), so that the releasing
-- client can tell waiters of its own at once. The fence key is not touched: fences keep
-- increasing.
-- Returns 0 when ARGV[1] does not hold the lock (nothing is changed then), after taking
-- ARGV[1] out of the queue if it waits there: a waiter that gave up. The next waiters get the
-- name at once if they fit now.
local token, keep = ARGV[1], tonumber(ARGV[2])
if token == '' then
  return 0 -- no holder has that token
end
local owner = redis.call('HGET', K[1], 'token')
local retention = tonumber(ARGV[4])
if owner == token then
  if keep > 0 then
    redis.call('HSET', K[1], 'token', '')
    redis.call('PEXPIRE', K[1], keep)
    if redis.call('EXISTS', K[3]) == 1 then
      redis.call('PUBLISH', ARGV[3], token)
    end
    return 1
  end
  redis.call('DEL', K[1])
  return handed_reply(hand_over(ARGV[3], token, retention))
end
if not owner then
  local lease = redis.call('ZSCORE', K[5], token)
  if lease then
    local now_ms = math.floor(now_us() / 1000)
    if tonumber(lease) > now_ms then
      if keep > 0 then
        local raw = redis.call('HGET', K[6], token)
        local kept = '\0' .. cjson.decode(raw).f
        -- Add before removing: a key left empty would go, and its expiry with it.
        redis.call('ZADD', K[5], now_ms + keep, kept)
        redis.call('HSET', K[6], kept, raw)
        redis.call('ZREM', K[5], token)
        redis.call('HDEL', K[6], token)
        outlive(keep)
        if redis.call('EXISTS', K[3]) == 1 then
          redis.call('PUBLISH', ARGV[3], token)
        end
        return 1
      end
      redis.call('ZREM', K[5], token)
      redis.call('HDEL', K[6], token)
      return handed_reply(hand_over(ARGV[3], token, retention))
    end
  end
end
if dequeue(token) and not owner then
  hand_over(ARGV[3], '', retention)
end
return 0
