-- After a node unsubscribed from a subject's channel: ARGV = base (lib.lua),
-- subject, history size. When no node listens any more and the subject
-- holds no history, its position goes: at once without history (its next
-- life starts a new epoch), after its retention with history.
-- Returns {bytes, messages, evictions, subjects}.
local s, size = ARGV[2], tonumber(ARGV[3])
if listeners(s) == 0 and redis.call('LLEN', hist_key(s)) == 0 then
  if size == 0 then
    redis.call('DEL', meta_key(s))
  else
    idle_if_empty(s, ttl_of(s))
  end
end
return {settle()}
