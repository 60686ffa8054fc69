-- The once-a-second pass: ARGV = base (lib.lua), most subjects to visit. Expires
-- the publications past their age limit on subjects nobody touches, and
-- scores again those whose expiry score was early (lib.lua).
-- Returns {bytes, messages, evictions, subjects}.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, s in ipairs(due) do
  local ttl = ttl_of(s)
  if ttl > 0 then
    expire(s, now, ttl, true)
  else
    redis.call('ZREM', EXPIRY, s)
  end
end
return {settle()}
