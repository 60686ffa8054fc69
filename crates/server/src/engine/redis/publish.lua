-- Publish: ARGV = prefix, subject, data, history size, age limit ms,
-- byte budget, a fresh epoch. Takes the next offset, keeps the publication
-- in history within the limits, and publishes it on the subject's channel,
-- all in one step.
-- Returns {epoch, offset, bytes, messages, evictions, subjects}; the epoch
-- is '' when nobody listens and nothing is kept (the publish is dropped).
local s, data = ARGV[2], ARGV[3]
local size, ttl, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local meta = meta_key(s)
if size == 0 and redis.call('EXISTS', meta) == 0 and listeners(s) == 0 then
  return {'', 0, totals()}
end
local epoch = stream(s, ARGV[7], ttl)
expire(s, now)
local offset = redis.call('HINCRBY', meta, 'o', 1)
if size > 0 then
  local order = redis.call('HINCRBY', TOTALS, 'order', 1)
  local cost = #data + #s + ENTRY_OVERHEAD
  local held = redis.call('RPUSH', hist_key(s), order .. ' ' .. offset .. ' ' .. now .. ' ' .. cost .. ' ' .. data)
  redis.call('HINCRBY', TOTALS, 'bytes', cost)
  redis.call('HINCRBY', TOTALS, 'messages', 1)
  redis.call('PERSIST', meta)
  while held > size do
    pop_oldest(s)
    held = held - 1
  end
  reindex(s, ttl)
  enforce_budget(max)
end
redis.call('PUBLISH', channel(s), epoch .. ' ' .. offset .. ' ' .. now .. ' ' .. data)
return {epoch, offset, totals()}
