-- extend.lua: renew one lease, for its owner only.
--
-- KEYS[1]  lock key <prefix>{<name>}
-- ARGV[1]  the owner's token
-- ARGV[2]  the new lease in milliseconds, counted from now
--
-- Returns 1 when the lock is held by ARGV[1] and its lease was set; 0 when the key is gone or
-- holds another token (nothing is changed then).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
