-- acquire_all.lua: one attempt to take several locks, all or none (after lock.lua). The
-- names share a Cluster slot (or the server is not a Cluster).
--
-- KEYS     six per name, in the order of lock.lua's K
-- ARGV[1]  how long the fence key outlives a lease, in milliseconds
-- then seven per name: the token, the lease in milliseconds, the instance, the label, the
-- attempt (unused: nobody is queued), the value, and -1 for an exclusive hold or the shared
-- holders' limit (0: none), as for acquire.lua
--
-- Returns {1, fence, ...}, a fence per name in order, when every name is now held by its
-- token: each fits beside its holders and no live waiter came first, or its token held it
-- already (a retry, whose lease is set again). Returns {0, i, pttl} otherwise, with nothing
-- changed but expired holders and waiters dropped: the i-th name (from 1) is busy for pttl
-- milliseconds, as acquire.lua counts it. Nobody is queued.
local retention = tonumber(ARGV[1])
local n = #KEYS / 6
local now = now_us()
local now_ms = math.floor(now / 1000)
local function use(i)
  K = {KEYS[6 * i - 5], KEYS[6 * i - 4], KEYS[6 * i - 3], KEYS[6 * i - 2], KEYS[6 * i - 1], KEYS[6 * i]}
  local a = 1 + 7 * (i - 1)
  return ARGV[a + 1], tonumber(ARGV[a + 2]), a, tonumber(ARGV[a + 7])
end
-- held tells how token holds the name now: 'x' exclusively, 's' shared, or nil.
local function held(token)
  local owner = redis.call('HGET', K[1], 'token')
  if owner == token then
    return 'x'
  end
  if not owner then
    local lease = redis.call('ZSCORE', K[5], token)
    if lease and tonumber(lease) > now_ms then
      return 's'
    end
  end
  return nil
end
for i = 1, n do
  local token, _, _, limit = use(i)
  local shared = limit >= 0
  if not held(token) then
    local owner = redis.call('HGET', K[1], 'token')
    local pttl
    if owner then
      pttl = redis.call('PTTL', K[1])
      if pttl == 0 then
        pttl = 1
      elseif pttl < 0 then
        pttl = 0
      end
    elseif not fits(shared, limit, now_ms) then
      local at = shared and 0 or -1
      local h = redis.call('ZRANGE', K[5], at, at, 'WITHSCORES')
      pttl = math.max(tonumber(h[2] or 0) - now_ms, 1)
    else
      local head, first = first_waiter(now_ms)
      if head and head ~= token then
        pttl = math.max(first.e - now_ms, 1)
      end
    end
    if pttl then
      return {0, i, pttl}
    end
  end
end
local fences = {1}
for i = 1, n do
  local token, ttl, a, limit = use(i)
  local how = held(token)
  local fence
  if how == 'x' then
    redis.call('PEXPIRE', K[1], ttl)
    fence = redis.call('HGET', K[1], 'fence')
  elseif how == 's' then
    redis.call('ZADD', K[5], 'XX', now_ms + ttl, token)
    outlive(ttl)
    fence = shared_fence(token)
  else
    dequeue(token)
    fence = grant(token, ttl, ARGV[a + 3], ARGV[a + 4], ARGV[a + 6], limit >= 0, retention, now)
  end
  fences[#fences + 1] = fence_reply(fence)
end
return fences
