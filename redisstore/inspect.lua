-- inspect.lua: what is known of one lock, for operators. Reads only.
--
-- KEYS: those of lock.lua (KEYS[4] unused).
-- ARGV[1]  "1" for every holder (List), "0" for the newest (Inspect)
--
-- Returns {last, waiting, holders, h...}: the fence key (false when gone), how many tokens are
-- queued, how many hold the name (kept windows included), and for each holder reported eight
-- entries {token, fence, instance, label, since, pttl, value, shared}: token "" for a kept
-- window, pttl its remaining lease in milliseconds, shared 1 or 0. A free name has none.
local out = {redis.call('GET', KEYS[2]), redis.call('ZCARD', KEYS[3]), 0}
local f = redis.call('HMGET', KEYS[1], 'token', 'fence', 'instance', 'label', 'since', 'value')
if f[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    out[3] = 1
    for _, v in ipairs({f[1], f[2] or '', f[3] or '', f[4] or '', f[5] or '', pttl, f[6] or '', 0}) do
      out[#out + 1] = v
    end
  end
  return out
end
if redis.call('EXISTS', KEYS[5]) == 0 then
  return out
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now_ms, '+inf', 'WITHSCORES')
out[3] = #live / 2
local best, best_fence
for i = 1, #live, 2 do
  local raw = redis.call('HGET', KEYS[6], live[i])
  if raw then
    local h = cjson.decode(raw)
    local token = live[i]
    if string.byte(token, 1) == 0 then
      token = ''
    end
    local rec = {token, h.f, h.i, h.l, h.s, tonumber(live[i + 1]) - now_ms, h.v or '', 1}
    if ARGV[1] == '1' then
      for _, v in ipairs(rec) do
        out[#out + 1] = v
      end
    elseif not best or #h.f > #best_fence or (#h.f == #best_fence and h.f > best_fence) then
      best, best_fence = rec, h.f
    end
  end
end
if best then
  for _, v in ipairs(best) do
    out[#out + 1] = v
  end
end
return out
