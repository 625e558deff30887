-- acquire.lua: one attempt to take a lock (after lock.lua).
--
-- ARGV[1]  the token asking
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  the instance that asks, ARGV[4] the acquisition's label (metadata for operators)
-- ARGV[5]  how long the fence key outlives the lease, in milliseconds
-- ARGV[6]  how long the token keeps a place in the queue, in milliseconds; 0: do not queue
-- ARGV[7]  the number of this request among its acquisition's (kept with the place)
-- ARGV[8]  the value the holder publishes (metadata, as the label)
-- ARGV[9]  -1 for an exclusive hold; else a shared one, among at most ARGV[9] shared holders
--          (0: any number)
--
-- Returns {1, fence} (see fence_reply) when the lock is now held by ARGV[1]: it fits beside
-- the holders (an exclusive request: nobody holds the name; a shared one: no exclusive holder,
-- and fewer shared ones than its limit, kept windows included) and no live waiter came before
-- ARGV[1]; or ARGV[1] held it already — a retry of a request whose reply was lost, or a waiter
-- the lock was handed to — whose lease is set again and whose fence is returned as is.
-- Returns {0, pttl, place} otherwise: pttl is how long the name stays unavailable to the
-- request in milliseconds — what is left of the exclusive holder's lease (or MinHold window),
-- at least 1 while the lock exists, though PTTL answers 0 in its last millisecond, 0 for a key
-- without expiry; for an exclusive request, what is left of the last shared holder's lease;
-- for a shared one at its limit, of the first's — or, when the name fits but another waiter
-- comes first, how long that waiter keeps its place; place is how long ARGV[1] keeps its place
-- in the queue (0 when it did not queue). ARGV[6] is no longer than the lease ARGV[2] (the
-- Store sees to that).
local token, ttl = ARGV[1], tonumber(ARGV[2])
local limit = tonumber(ARGV[9])
local shared = limit >= 0
local now
local function clock()
  now = now_us()
  return math.floor(now / 1000)
end
if redis.call('EXISTS', K[1], K[3], K[5]) == 0 then
  -- The common case, in three calls fewer than below: nobody holds the name (no K[1]),
  -- shares it (no K[5]) or waits for it (no K[3]), so the request fits and comes first.
  clock()
  return {1, fence_reply(grant(token, ttl, ARGV[3], ARGV[4], ARGV[8], shared, tonumber(ARGV[5]), now))}
end
local owner = redis.call('HGET', K[1], 'token')
if owner == token then
  redis.call('PEXPIRE', K[1], ttl)
  return {1, fence_reply(redis.call('HGET', K[1], 'fence'))}
end
local free = false
local head, first
if not owner then
  if shared then
    local lease = redis.call('ZSCORE', K[5], token)
    if lease and tonumber(lease) > clock() then
      redis.call('ZADD', K[5], 'XX', math.floor(now / 1000) + ttl, token)
      outlive(ttl)
      return {1, fence_reply(shared_fence(token))}
    end
  end
  free = fits(shared, limit, now and math.floor(now / 1000) or clock())
  if free then
    head, first = first_waiter(math.floor(now / 1000))
    if not head or head == token then
      if head then
        dequeue(head)
      end
      return {1, fence_reply(grant(token, ttl, ARGV[3], ARGV[4], ARGV[8], shared, tonumber(ARGV[5]), now))}
    end
  end
end
local place = tonumber(ARGV[6])
if place > 0 then
  local now_ms = now and math.floor(now / 1000) or clock()
  redis.call('ZADD', K[3], 'NX', now, token)
  redis.call('HSET', K[4], token,
    cjson.encode({e = now_ms + place, p = place, t = ttl, i = ARGV[3], l = ARGV[4], v = ARGV[8],
      a = tonumber(ARGV[7]), s = shared, n = math.max(limit, 0)}))
  -- The queue goes when every place in it has expired. Places differ (each is no longer
  -- than its waiter's lease): a short one never shortens the queue's life.
  if redis.call('PTTL', K[3]) < place then
    redis.call('PEXPIRE', K[3], place)
    redis.call('PEXPIRE', K[4], place)
  end
end
local pttl
if owner then
  pttl = redis.call('PTTL', K[1])
  if pttl == 0 then
    pttl = 1 -- its last millisecond: still held
  elseif pttl < 0 then
    pttl = 0 -- a key without expiry, written by something else: unknown
  end
elseif not free then
  -- Shared holders are in the way: an exclusive request waits for the last of them, a
  -- shared one at its limit for the first.
  local at = shared and 0 or -1
  local h = redis.call('ZRANGE', K[5], at, at, 'WITHSCORES')
  pttl = math.max(tonumber(h[2] or 0) - math.floor(now / 1000), 1)
else
  pttl = math.max(first.e - math.floor(now / 1000), 1)
end
return {0, pttl, place}
