-- release.lua: give a lock up, for its owner only.
--
-- KEYS[1]  lock key <prefix>{<name>}
-- ARGV[1]  the owner's token
-- ARGV[2]  keep: milliseconds the name must stay taken (the rest of a MinHold window), or 0
-- ARGV[3]  the release channel <prefix>{<name>}:released
--
-- Returns 0 when the key is gone or holds another token (nothing is changed then). Otherwise
-- returns 1 after either keeping the name taken for keep under the token "" — which no owner
-- has, so a renewal of ARGV[1] still on the wire cannot shorten the window — or deleting the
-- key; and publishes the token on the channel, so that waiters try again (after a keep, they
-- learn when the window ends). The fence key is not touched: fences keep increasing.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], 'token', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
