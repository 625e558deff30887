-- extend.lua: renew one lease, for its owner only.
--
-- KEYS[1]  lock key  <prefix>{<name>}
-- KEYS[2]  fence key <prefix>{<name>}:fence
-- ARGV[1]  the owner's token
-- ARGV[2]  the new lease in milliseconds, counted from now
-- ARGV[3]  how long the fence key outlives the lease, in milliseconds
--
-- Returns 1 when the lock is held by ARGV[1] and its lease was set; 0 when the key is gone,
-- holds another token, or is kept for a MinHold window (nothing is changed then).
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[3]))
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
