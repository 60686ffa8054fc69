-- The once-a-second pass: ARGV = prefix, most subjects to visit. Expires
-- the publications past their age limit on subjects nobody touches.
-- Returns {bytes, messages, evictions, subjects}.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, s in ipairs(due) do expire(s, now, ttl_of(s)) end
return {settle()}
