-- commit.lua writes an account's new balance under a fence, unless the account has accepted a
-- higher fence: the write of a holder whose lock was taken over.
--
-- KEYS[1]  the account's hash: fields balance and fence
-- ARGV[1]  the new balance
-- ARGV[2]  the fence, a decimal uint64
--
-- Returns "" when it wrote, or the higher fence the account has accepted (and writes nothing).

local stored = redis.call('HGET', KEYS[1], 'fence') or '0'
-- Compare the fences as decimal strings, the shorter being the smaller: a Lua number loses
-- precision above 2^53.
if #stored > #ARGV[2] or (#stored == #ARGV[2] and stored > ARGV[2]) then
	return stored
end
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'fence', ARGV[2])
return ''
