-- release.lua: give a lock up, for its owner only.
--
-- KEYS[1]  lock key <prefix>{<name>}
-- ARGV[1]  the owner's token
-- ARGV[2]  keep: milliseconds the name must stay locked (the rest of a MinHold window), or 0
-- ARGV[3]  the release channel <prefix>{<name>}:released
-- ARGV[4]  the notification payload (the lock name)
--
-- Returns 0 when the key is gone or holds another token (nothing is changed then). Otherwise
-- returns 1 after either shortening the lease to keep (the name stays locked and nobody is
-- told), or deleting the key and publishing on the channel so that waiters try again at once.
-- The fence key is never touched: fences keep increasing across releases.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
