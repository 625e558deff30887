-- force.lua: free a lock whoever holds it (an operator's forced release).
--
-- KEYS[1]  lock key <prefix>{<name>}
-- ARGV[1]  the release channel <prefix>{<name>}:released
--
-- Returns 0 when the name is free. Otherwise deletes the lock key — its holder's next renewal
-- finds it gone — publishes an empty token so that waiters try again (every Guard's: the
-- holder's own Guard did not release it), and returns 1. The fence key is kept: the next owner
-- gets a higher fence.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '')
return 1
