-- force.lua: an operator's release (Inspector.ForceRelease), whoever holds the lock, but only
-- while it is held with the fence the operator saw (after lock.lua).
--
-- ARGV[1]  the fence the holder must have, in decimal; "0": every holder
-- ARGV[2]  the release channel <prefix>{n}:released
-- ARGV[3]  how long the fence key outlives a lease, in milliseconds
--
-- Returns 0 when the name is free, and {2, fence} when no holder (nor MinHold window) has the
-- fence ARGV[1] — fence is the newest holder's: nothing is changed then. Otherwise frees that
-- holder (with "0": the exclusive one, or every shared one) and hands what it frees to the
-- first live waiters that fit (see hand_over, which tells each waiter's Guard on the channel;
-- the released token is "", for no Guard released the lock itself): returns {1, next, fence,
-- lease, attempt, ...}, or 1 when nobody was handed it. The fence key is not touched: fences
-- keep increasing.
local retention = tonumber(ARGV[3])
local fence = redis.call('HGET', K[1], 'fence')
if fence then
  if ARGV[1] ~= '0' and fence ~= ARGV[1] then
    return {2, fence_reply(fence)}
  end
  redis.call('DEL', K[1])
  return handed_reply(hand_over(ARGV[2], '', retention))
end
if shared_count(math.floor(now_us() / 1000)) == 0 then
  return 0
end
if ARGV[1] == '0' then
  redis.call('DEL', K[5], K[6])
  return handed_reply(hand_over(ARGV[2], '', retention))
end
local newest
local all = redis.call('HGETALL', K[6])
for i = 1, #all, 2 do
  local f = cjson.decode(all[i + 1]).f
  if f == ARGV[1] then
    redis.call('ZREM', K[5], all[i])
    redis.call('HDEL', K[6], all[i])
    return handed_reply(hand_over(ARGV[2], '', retention))
  end
  if not newest or fence_less(newest, f) then
    newest = f
  end
end
return {2, fence_reply(newest)}
