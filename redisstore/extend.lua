-- extend.lua: renew many leases in one script, each for its holder only — exclusive or
-- shared — one after another, in one step. All keys must live in one Cluster slot.
--
-- KEYS[4i-3..4i]  lease i's lock key <prefix>{<name>}, fence key <prefix>{<name>}:fence,
--                 shared holders <prefix>{<name>}:shared and their data <prefix>{<name>}:holders
-- ARGV[1]         how long the fence key outlives the lease, in milliseconds
-- ARGV[2i]        lease i's holder token
-- ARGV[2i+1]      lease i's new lease in milliseconds, counted from now
--
-- Returns one integer per lease, in order: 1 when the lock is held by its token and its lease
-- was set; 0 when the key is gone, holds another token, or is kept for a MinHold window
-- (nothing is changed then). A lock named twice is set twice, in order: the last lease stands.
local retention = tonumber(ARGV[1])
local out = {}
local now_ms
for i = 1, #KEYS / 4 do
  local k = 4 * (i - 1)
  local token = ARGV[2 * i]
  local ttl = tonumber(ARGV[2 * i + 1])
  local life = ttl + retention
  local r = 0
  local owner = redis.call('HGET', KEYS[k + 1], 'token')
  if owner == token then
    redis.call('PEXPIRE', KEYS[k + 2], life)
    r = redis.call('PEXPIRE', KEYS[k + 1], ttl)
  elseif not owner then
    local lease = redis.call('ZSCORE', KEYS[k + 3], token)
    if lease then
      if not now_ms then
        local t = redis.call('TIME')
        now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      if tonumber(lease) > now_ms then
        redis.call('ZADD', KEYS[k + 3], 'XX', now_ms + ttl, token)
        if redis.call('PTTL', KEYS[k + 3]) < ttl then
          redis.call('PEXPIRE', KEYS[k + 3], ttl)
          redis.call('PEXPIRE', KEYS[k + 4], ttl)
        end
        if redis.call('PTTL', KEYS[k + 2]) < life then
          redis.call('PEXPIRE', KEYS[k + 2], life)
        end
        r = 1
      end
    end
  end
  out[i] = r
end
return out
