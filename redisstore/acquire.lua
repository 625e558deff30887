-- acquire.lua: one attempt to take a lock (after lock.lua).
--
-- ARGV[1]  the token asking
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the instance that asks, ARGV[4] the acquisition's label (metadata for operators)
-- ARGV[5]  how long the fence key outlives the lease, in milliseconds
-- ARGV[6]  how long the token keeps a place in the queue, in milliseconds; 0: do not queue
--
-- Returns {1, fence} (see fence_reply) when the lock is now held by ARGV[1]: it was free and no live waiter came
-- before ARGV[1]; or ARGV[1] held it already — a retry of a request whose reply was lost, or a
-- waiter the lock was handed to — whose lease is set again and whose fence is returned as is.
-- Returns {0, pttl, place} otherwise: pttl is what is left of the holder's lease (or MinHold
-- window) in milliseconds, 0 when the name is free but others wait first; place is how long
-- ARGV[1] keeps its place in the queue (0 when it did not queue).
local owner = redis.call('HGET', KEYS[1], 'token')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence_reply(redis.call('HGET', KEYS[1], 'fence'))}
end
local now
local function clock()
  now = now_us()
  return math.floor(now / 1000)
end
if not owner then
  local head = first_waiter(clock)
  if not head or head == ARGV[1] then
    if head then
      dequeue(head)
    end
    if not now then
      clock()
    end
    return {1, fence_reply(grant(ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), now))}
  end
end
local place = tonumber(ARGV[6])
if place > 0 then
  local now_ms = now and math.floor(now / 1000) or clock()
  redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
  redis.call('HSET', KEYS[4], ARGV[1],
    cjson.encode({e = now_ms + place, p = place, t = tonumber(ARGV[2]), i = ARGV[3], l = ARGV[4]}))
  -- The queue goes when no waiter has asked for a whole place: every place in it has expired.
  redis.call('PEXPIRE', KEYS[3], place)
  redis.call('PEXPIRE', KEYS[4], place)
end
local pttl = 0
if owner then
  pttl = redis.call('PTTL', KEYS[1])
end
return {0, pttl, place}
