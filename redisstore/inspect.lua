-- inspect.lua: what is known of one lock, for operators. Reads only.
--
-- KEYS[1]  lock key  <prefix>{n}, KEYS[2] fence key <prefix>{n}:fence, KEYS[3] queue
-- <prefix>{n}:queue
--
-- Returns {token, fence, instance, label, since, pttl, last, waiting}: the lock's fields
-- (false when it is free), its remaining lease in milliseconds (negative when free), the fence
-- key (false when gone), and how many tokens are queued.
local f = redis.call('HMGET', KEYS[1], 'token', 'fence', 'instance', 'label', 'since')
return {f[1], f[2], f[3], f[4], f[5], redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  redis.call('ZCARD', KEYS[3])}
