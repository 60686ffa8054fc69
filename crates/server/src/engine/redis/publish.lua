-- Publish a run of publications: ARGV = base (lib.lua), byte budget, a fresh
-- epoch, the master's replication id ('' = none; lib.lua, "failover"),
-- then four per publication: subject, data, history size, age
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
-- once per run. A publication then costs four Redis calls (reading its
-- subject's hash, taking the next offset with HINCRBY, which neither
-- parses nor formats it in Lua, storing and publishing it), five when it
-- drops the oldest entry of a full history: the indexes are left early
-- (lib.lua), and the oldest entry is read only once its recorded time
-- says it may have expired. The entry is also the channel message, so
-- each is built once, and the clock is formatted once per run.
local max = tonumber(ARGV[2])
local replid = ARGV[4]
local runs = (#ARGV - 4) / 4
local now = now_ms()
local now_text = int(now)
local order = redis.call('HINCRBY', TOTALS, 'order', runs) - runs
local positions = {}

local function publish(s, data, size, ttl)
  local meta = meta_key(s)
  local known = redis.call('HMGET', meta, 'e', 't', 'h', 'r')
  local epoch = known[1]
  local old_ttl, oldest = tonumber(known[2]), tonumber(known[3])
  if epoch and renew_if_moved(s, epoch, known[4], ARGV[3], replid) ~= epoch then
    epoch, oldest = ARGV[3], nil
  end
  local fields = {}
  if not epoch then
    if size == 0 and listeners(s) == 0 then
      return '', 0
    end
    epoch = ARGV[3]
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = epoch
    if replid ~= '' then
      fields[#fields + 1] = 'r'
      fields[#fields + 1] = replid
    end
  end
  if old_ttl ~= ttl then
    retime(s, ttl, oldest)
    fields[#fields + 1] = 't'
    fields[#fields + 1] = ttl
  end
  if ttl > 0 and oldest and oldest + ttl <= now then
    expire(s, now, ttl, true)
  end
  local offset = redis.call('HINCRBY', meta, 'o', 1)
  order = order + 1
  local entry = epoch .. ' ' .. int(order) .. ' ' .. int(offset) .. ' ' .. now_text .. ' ' .. data
  if size > 0 then
    local held = redis.call('RPUSH', hist_key(s), entry)
    ledger.bytes = ledger.bytes + cost_of(s, #data)
    ledger.messages = ledger.messages + 1
    if held == 1 then
      -- The first entry: the subject enters the indexes, and loses the
      -- idle expiry a stream without history may carry.
      index(s, order, now, ttl)
      redis.call('PERSIST', meta)
      fields[#fields + 1] = 'h'
      fields[#fields + 1] = now
    end
    while held > size do
      pop_oldest(s)
      held = held - 1
    end
  end
  if #fields > 0 then redis.call('HSET', meta, unpack(fields)) end
  if size > 0 then enforce_budget(max) end
  redis.call('SPUBLISH', channel(s), entry)
  return epoch, offset
end

for i = 0, runs - 1 do
  local at = 5 + i * 4
  local epoch, offset = publish(ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]))
  positions[#positions + 1] = epoch
  positions[#positions + 1] = offset
end
local b, m, e, n = settle()
local reply = {b, m, e, n}
for _, v in ipairs(positions) do reply[#reply + 1] = v end
return reply
