-- Publish a run of publications: ARGV = prefix, byte budget, a fresh
-- epoch, then four per publication: subject, data, history size, age
-- limit ms. Each takes its subject's next offset, is kept in history
-- within the limits, and is published on the subject's channel; the whole
-- run is one step, in order.
-- Returns {bytes, messages, evictions, subjects, then epoch and offset of
-- each publication}; an epoch is '' when nobody listens and nothing is
-- kept (that publication is dropped).
--
-- Redis runs one script at a time, so what this costs per publication is
-- the cluster's publish ceiling (docs/benchmarks.md, "Through Redis").
-- The per-script costs (the call itself, the clock, the totals) are paid
-- once per run; a subject whose history is full then costs eight Redis
-- calls (nine with an age limit), and work that cannot change anything (re-indexing a head that did
-- not move, persisting a key that has no expiry) is skipped.
local max = tonumber(ARGV[2])
local runs = (#ARGV - 3) / 4
local now = now_ms()
local order = redis.call('HINCRBY', TOTALS, 'order', runs) - runs
local positions = {}

local function publish(s, data, size, ttl)
  local meta = meta_key(s)
  local known = redis.call('HMGET', meta, 'e', 't')
  local epoch = known[1]
  -- The age limit changed (or the stream is new): the indexes must follow.
  local ttl_changed = tonumber(known[2]) ~= ttl
  if not epoch then
    if size == 0 and listeners(s) == 0 then
      return '', 0
    end
    epoch = ARGV[3]
    redis.call('HSET', meta, 'e', epoch, 'o', 0, 't', ttl)
  elseif ttl_changed then
    redis.call('HSET', meta, 't', ttl)
  end
  expire(s, now, ttl)
  local offset = redis.call('HINCRBY', meta, 'o', 1)
  if size > 0 then
    order = order + 1
    local cost = #data + #s + ENTRY_OVERHEAD
    local held = redis.call('RPUSH', hist_key(s), order .. ' ' .. offset .. ' ' .. now .. ' ' .. cost .. ' ' .. data)
    ledger.bytes = ledger.bytes + cost
    ledger.messages = ledger.messages + 1
    -- Only a stream with no history can carry an idle expiry (idle_if_empty).
    if held == 1 then redis.call('PERSIST', meta) end
    local dropped = 0
    while held > size do
      pop_oldest(s)
      dropped = dropped + 1
      held = held - 1
    end
    -- The head moved only if this is the first entry or some were dropped.
    if held == 1 or dropped > 0 or ttl_changed then reindex(s, ttl) end
    enforce_budget(max)
  end
  redis.call('PUBLISH', channel(s), epoch .. ' ' .. offset .. ' ' .. now .. ' ' .. data)
  return epoch, offset
end

for i = 0, runs - 1 do
  local at = 4 + i * 4
  local epoch, offset = publish(ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]))
  positions[#positions + 1] = epoch
  positions[#positions + 1] = offset
end
local b, m, e, n = settle()
local reply = {b, m, e, n}
for _, v in ipairs(positions) do reply[#reply + 1] = v end
return reply
