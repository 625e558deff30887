-- release.lua: give a lock up, for its owner only; or, forced, whoever holds it (after lock.lua).
--
-- ARGV[1]  the owner's token; "" to force the release (an operator's ForceRelease)
-- ARGV[2]  keep: milliseconds the name must stay taken (the rest of a MinHold window), or 0
-- ARGV[3]  the release channel <prefix>{n}:released
-- ARGV[4]  how long the fence key outlives a lease, in milliseconds
--
-- Returns 1 after either keeping the name taken for keep under the token "" — which no owner
-- has, so a renewal of ARGV[1] still on the wire cannot shorten the window — and telling the
-- waiters, who learn when the window ends; or freeing it. Returns {1, next, fence} after
-- freeing it and handing it to the first live waiter (see hand_over), so that the releasing
-- client can tell a waiter of its own at once. The fence key is not touched: fences keep
-- increasing.
-- Returns 0 when ARGV[1] does not hold the lock (nothing is changed then), after taking
-- ARGV[1] out of the queue if it waits there: a waiter that gave up. If the name is free, the
-- next waiter gets it at once.
local owner = redis.call('HGET', KEYS[1], 'token')
local retention = tonumber(ARGV[4])
if ARGV[1] == '' then
  if not owner then
    return 0
  end
elseif owner ~= ARGV[1] then
  if dequeue(ARGV[1]) and not owner then
    hand_over(ARGV[3], '', retention)
  end
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], 'token', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('PUBLISH', ARGV[3], ARGV[1])
  end
  return 1
end
redis.call('DEL', KEYS[1])
local next, fence = hand_over(ARGV[3], ARGV[1], retention)
if next then
  return {1, next, fence}
end
return 1
