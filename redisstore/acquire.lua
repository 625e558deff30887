-- acquire.lua: one attempt to take a lock.
--
-- KEYS[1]  lock key  <prefix>{<name>}        hash: token, fence, instance, label, since (server
--                                            ms); its expiry is the lease
-- KEYS[2]  fence key <prefix>{<name>}:fence  string: the last fence given for the name
-- ARGV[1]  the new owner's token
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the instance that asks, ARGV[4] the acquisition's label (metadata for operators)
-- ARGV[5]  how long the fence key outlives the lease, in milliseconds
--
-- Returns {1, fence} when the lock is now held by ARGV[1]. That includes a lock ARGV[1] held
-- already — a retry of a request whose reply was lost — whose lease is set again and whose
-- fence is returned unchanged.
-- Returns {0, pttl} when another owner holds the lock, or it is kept for the rest of a MinHold
-- window (token ""): pttl is what is left of that, in milliseconds.
--
-- The fence is max(last fence + 1, the server's time in microseconds). The fence key keeps
-- the count while the name is in use; when it is gone — expired, evicted, or lost with a
-- restart — the server's clock still puts the next fence above every earlier one, because
-- each of those was at most its own grant time in microseconds (plus the grants that came
-- within the same microseconds). Fences travel as strings, exact in 64 bits.
redis.replicate_commands() -- TIME before writes; the default since Redis 5, a no-op since 7
local owner = redis.call('HGET', KEYS[1], 'token')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'fence')}
end
if owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- INCR counts exactly in 64 bits; its value as a Lua number is only compared with the clock.
if redis.call('INCR', KEYS[2]) < now then
  redis.call('SET', KEYS[2], string.format('%.0f', now))
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[5]))
local fence = redis.call('GET', KEYS[2])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence, 'instance', ARGV[3],
  'label', ARGV[4], 'since', string.format('%.0f', math.floor(now / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
