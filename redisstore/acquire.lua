-- acquire.lua: one attempt to take a lock.
--
-- KEYS[1]  lock key  <prefix>{<name>}        string: the owner's token, expires after the lease
-- KEYS[2]  fence key <prefix>{<name>}:fence  counter: never expires, never deleted
-- ARGV[1]  the new owner's token
-- ARGV[2]  the lease in milliseconds
--
-- Returns {1, fence} when the lock was free and is now held by ARGV[1]; fence is the counter
-- after INCR, read back with GET so that it reaches the client as a string, exactly (Lua
-- numbers are doubles, which would round counters beyond 2^53).
-- Returns {0, pttl} when someone else holds the lock: pttl is what is left of the holder's
-- lease in milliseconds (-1 when the key has no expiry).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('INCR', KEYS[2])
  return {1, redis.call('GET', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
