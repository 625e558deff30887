-- force.lua: free a lock whoever holds it (an operator's forced release).
--
-- KEYS[1]  lock key <prefix>{<name>}
-- ARGV[1]  the release channel <prefix>{<name>}:released
--
-- Returns 0 when the name is free. Otherwise deletes the lock key — its holder's next renewal
-- finds it gone — publishes the holder's token so that waiters try again, and returns 1. The
-- fence key is kept: the next owner gets a higher fence.
local owner = redis.call('HGET', KEYS[1], 'token')
if not owner then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], owner)
return 1
