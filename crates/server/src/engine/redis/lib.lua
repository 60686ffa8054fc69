#!lua
-- myriad's Redis engine: what every script shares. Loaded in front of each
-- entry script (see scripts.rs), so every script sees the same key layout.
--
-- A script works on one partition (keys.rs): ARGV[1] is always its base
-- P, "<prefix>:{<partition>}", whose hash tag puts every key and channel
-- below in one Redis Cluster slot, and KEYS[1..3] are always its shared
-- keys P:totals, P:oldest and P:expiry, so the slot is declared. Keys:
--   P:s:<subject>  hash: e (epoch, 16 hex digits), o (last offset),
--                  t (history age limit in ms, 0 = none), h (while the
--                  subject holds history: the time of its oldest entry,
--                  or an earlier one), r (behind Sentinels: the master's
--                  replication id the epoch was started or renewed under)
--   P:h:<subject>  list: the subject's history, oldest first; each entry
--                  "<epoch> <order> <offset> <ms> <data>" (the epoch is
--                  the subject's, the same in every entry of the list)
--   P:oldest       zset: subjects holding history, each scored by the
--                  store order of its oldest entry or an earlier one (the
--                  budget evicts from its front)
--   P:expiry       zset: subjects with an age limit, each scored by when
--                  its oldest entry expires or earlier (the sweep reads
--                  its front)
--   P:totals       hash: bytes, messages, evictions, order
-- and the channel P:c:<subject> carries the publication's history entry
-- itself, so a publish builds one string for both. Building it is a
-- cost of its own: Redis's Lua hashes every byte of every string it
-- makes, about 0.65 µs for an entry of 512 bytes of data
-- (docs/benchmarks.md, "Through Redis"), so a script makes each entry
-- once and reads one back only where it must.
--
-- Numbers are written into entries with `int`, never with `..`: Lua's own
-- number format (%.14g) writes 10^14 as "1e+14".
--
-- The scores and h may lag behind the history (a publish that drops the
-- oldest entry of a full history leaves them): each is only ever early,
-- so whoever acts on one reads the real oldest entry first and puts it
-- right (budget, expire, reindex). That keeps a publish to a full history
-- at five Redis calls instead of nine.
--
-- Scripts make the subjects' keys from P in Lua (the budget evicts from
-- subjects the caller cannot name), never a key of another partition: each
-- lies in the slot KEYS[] declare. The first line, a shebang without
-- flags, is what makes Redis (7.0 on) check that: in a cluster it refuses
-- such a script touching a key of another slot, where a script without
-- one (the EVAL compatibility mode) is let through (slot_tests.rs).

local P = ARGV[1]
local TOTALS, OLDEST, EXPIRY = KEYS[1], KEYS[2], KEYS[3]
if TOTALS ~= P .. ':totals' or OLDEST ~= P .. ':oldest' or EXPIRY ~= P .. ':expiry' then
  return redis.error_reply('KEYS are not the shared keys of partition ' .. P)
end
-- What a kept entry costs beyond its data and subject, for the byte budget.
local ENTRY_OVERHEAD = 64
-- How long a subject with history but no age limit keeps its position once
-- it has neither subscribers nor history (the memory engine's rule).
local IDLE_RETENTION_MS = 3600000

local function meta_key(s) return P .. ':s:' .. s end
local function hist_key(s) return P .. ':h:' .. s end
local function channel(s) return P .. ':c:' .. s end

-- What this script changed of the totals' bytes, messages and evictions,
-- written once when it ends (settle): one publish script serves many
-- publications, and three HINCRBYs per publication were a fifth of its
-- Redis calls. A script that errors part way (a bug) keeps what its
-- calls so far did, since Redis does not undo them, but never writes
-- the ledger: the totals then drift from the history they describe.
local ledger = {bytes = 0, messages = 0, evictions = 0}
local stored_bytes = nil

-- History bytes on this Redis, this script's changes included.
local function held_bytes()
  if not stored_bytes then
    stored_bytes = tonumber(redis.call('HGET', TOTALS, 'bytes') or '0')
  end
  return stored_bytes + ledger.bytes
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as decimal digits.
local function int(n)
  return string.format('%d', n)
end

-- order, offset, ms of an entry, and where its data starts.
local function parse(entry)
  local order, offset, ms, data = string.match(entry, '^%x+ (%d+) (%d+) (%d+) ()')
  return tonumber(order), tonumber(offset), tonumber(ms), data
end

-- What a publication of `data_len` bytes on subject s costs against the
-- byte budget (the memory engine's measure: not the entry's header).
local function cost_of(s, data_len)
  return data_len + #s + ENTRY_OVERHEAD
end

-- What a kept entry of subject s costs.
local function entry_cost(s, entry)
  local _, _, _, data = parse(entry)
  return cost_of(s, #entry - data + 1)
end

-- Nodes subscribed to the subject's channel (a sharded channel: SPUBLISH,
-- SSUBSCRIBE; instance.rs).
local function listeners(s)
  return tonumber(redis.call('PUBSUB', 'SHARDNUMSUB', channel(s))[2])
end

local function ttl_of(s)
  return tonumber(redis.call('HGET', meta_key(s), 't') or '0')
end

-- Scores the subject in the expiry index by the time `ms` of its oldest
-- entry, or takes it out when it has no age limit.
local function score_expiry(s, ms, ttl)
  if ttl > 0 then
    redis.call('ZADD', EXPIRY, ms + ttl, s)
  else
    redis.call('ZREM', EXPIRY, s)
  end
end

-- Scores the subject in the indexes by its oldest entry's store order and
-- time.
local function index(s, order, ms, ttl)
  redis.call('ZADD', OLDEST, order, s)
  score_expiry(s, ms, ttl)
end

-- Takes the subject out of the indexes once it holds no history.
local function unindex(s)
  redis.call('ZREM', OLDEST, s)
  redis.call('ZREM', EXPIRY, s)
  redis.call('HDEL', meta_key(s), 'h')
end

-- Puts the subject back in the indexes, and its h, by its oldest entry as
-- it is now. Answers that entry's time (nil when the history is empty).
local function reindex(s, ttl)
  local head = redis.call('LINDEX', hist_key(s), 0)
  if not head then
    unindex(s)
    return nil
  end
  local order, _, ms = parse(head)
  index(s, order, ms, ttl)
  redis.call('HSET', meta_key(s), 'h', ms)
  return ms
end

-- A subject left with no history and no listeners keeps its position only
-- for its retention, then Redis forgets it.
local function idle_if_empty(s, ttl)
  if redis.call('LLEN', hist_key(s)) == 0 and listeners(s) == 0 then
    local retention = IDLE_RETENTION_MS
    if ttl > 0 then retention = ttl end
    redis.call('PEXPIRE', meta_key(s), retention)
  end
end

-- Takes a dropped entry of subject s off the totals.
local function dropped(s, entry)
  ledger.bytes = ledger.bytes - entry_cost(s, entry)
  ledger.messages = ledger.messages - 1
end

-- Drops the subject's oldest entry (there is one).
local function pop_oldest(s)
  dropped(s, redis.call('LPOP', hist_key(s)))
end

-- Drops the subject's oldest entry, already read as `head`: trimmed, not
-- popped, so Redis does not make the entry into a Lua string again.
local function drop_head(s, head)
  redis.call('LTRIM', hist_key(s), 1, -1)
  dropped(s, head)
end

-- Drops the subject's publications older than its age limit `ttl` (ms,
-- > 0). When it dropped any, or `rescore` asks, the subject's expiry
-- score and h then name its oldest entry as it is now (its oldest score
-- may stay early).
local function expire(s, now, ttl, rescore)
  local popped = false
  local ms
  while true do
    local head = redis.call('LINDEX', hist_key(s), 0)
    if not head then ms = nil break end
    ms = select(3, parse(head))
    if ms + ttl > now then break end
    drop_head(s, head)
    popped = true
  end
  if not (popped or rescore) then return end
  if ms then
    redis.call('ZADD', EXPIRY, ms + ttl, s)
    redis.call('HSET', meta_key(s), 'h', ms)
  else
    unindex(s)
    idle_if_empty(s, ttl)
  end
end

-- The subject's age limit has changed to `ttl`: its expiry score follows,
-- from the time `h` of its oldest entry (nil: no history). The caller
-- writes t.
local function retime(s, ttl, h)
  if h then score_expiry(s, h, ttl) end
end

-- Evicts this Redis's oldest publications until history fits `max` bytes.
-- A subject at the front whose score is early is scored again, not
-- evicted from: the front is the oldest entry only once its score is real.
local function enforce_budget(max)
  while held_bytes() > max do
    local first = redis.call('ZRANGE', OLDEST, 0, 0, 'WITHSCORES')
    if #first == 0 then break end
    local s, score = first[1], tonumber(first[2])
    local ttl = ttl_of(s)
    local head = redis.call('LINDEX', hist_key(s), 0)
    if head and parse(head) <= score then
      drop_head(s, head)
      ledger.evictions = ledger.evictions + 1
      if not reindex(s, ttl) then idle_if_empty(s, ttl) end
    else
      reindex(s, ttl)
    end
  end
end

-- Writes the ledger, then answers bytes, messages, evictions and subjects
-- with history: what stats report. Every script ends with it, once (each
-- call runs this file afresh, so nothing here outlives the call).
local function settle()
  for field, change in pairs(ledger) do
    if change ~= 0 then
      redis.call('HINCRBY', TOTALS, field, change)
    end
  end
  local t = redis.call('HMGET', TOTALS, 'bytes', 'messages', 'evictions')
  return tonumber(t[1] or 0), tonumber(t[2] or 0), tonumber(t[3] or 0), redis.call('ZCARD', OLDEST)
end

-- Failover. Replication is asynchronous: a replica promoted by Sentinel
-- may lack the newest writes, so a stream there may hand out again
-- offsets that named other publications on the old master, and a client
-- recovering across it would be told `recovered: true` with the wrong
-- messages. Promotion gives the new master a new replication id
-- (`master_replid`), which the node reads at every connect and passes to
-- the scripts (`replid`, '' outside the Sentinel shape: never compared).
-- A stream records the id it was started under (r); one met under
-- another id is renewed: a new epoch from offset 0, its history dropped,
-- so every position handed out before names no publication of the new
-- stream (recovering from one gives `recovered: false`). Streams the
-- replica had whole are renewed too: the node cannot tell them apart.
-- Answers the epoch the stream goes on in.
local function renew_if_moved(s, epoch, r, new_epoch, replid)
  if replid == '' or r == replid then return epoch end
  local hist = hist_key(s)
  for _, entry in ipairs(redis.call('LRANGE', hist, 0, -1)) do
    dropped(s, entry)
  end
  redis.call('DEL', hist)
  unindex(s)
  redis.call('HSET', meta_key(s), 'e', new_epoch, 'o', 0, 'r', replid)
  return new_epoch
end

-- Writes the replication id a new stream starts under.
local function stamp(s, replid)
  if replid ~= '' then redis.call('HSET', meta_key(s), 'r', replid) end
end

-- The subject's epoch and offset, creating its stream (in a new epoch)
-- when Redis has none, renewing it after a failover.
local function stream(s, new_epoch, ttl, replid)
  local meta = meta_key(s)
  local known = redis.call('HMGET', meta, 'e', 'o', 't', 'h', 'r')
  local epoch, offset = known[1], tonumber(known[2])
  if epoch then
    local renewed = renew_if_moved(s, epoch, known[5], new_epoch, replid)
    if renewed ~= epoch then
      epoch, offset, known[4] = renewed, 0, false
    end
  end
  if not epoch then
    epoch, offset = new_epoch, 0
    redis.call('HSET', meta, 'e', epoch, 'o', 0, 't', ttl)
    stamp(s, replid)
  elseif tonumber(known[3]) ~= ttl then
    retime(s, ttl, tonumber(known[4]))
    redis.call('HSET', meta, 't', ttl)
  end
  return epoch, offset
end

-- What a recovery from (se, so) finds: 1 and the entries after it (at most
-- `limit`, within `max_cost` bytes), or 0 when the epoch differs, history
-- no longer reaches back to it, or it would pass `max_cost`.
local function recover(s, epoch, offset, se, so, limit, max_cost)
  if se ~= epoch or so > offset then return 0, {} end
  if so == offset then return 1, {} end
  local head = redis.call('LINDEX', hist_key(s), 0)
  if not head then return 0, {} end
  local _, first = parse(head)
  if first > so + 1 then return 0, {} end
  local from = so + 1 - first
  local to = math.min(from + limit - 1, offset - first)
  local entries = redis.call('LRANGE', hist_key(s), from, to)
  if #entries == 0 then return 1, {} end
  -- History holds consecutive offsets; anything else is a stream this
  -- script cannot vouch for, so the recovery is reported incomplete.
  local _, got = parse(entries[1])
  if got ~= so + 1 then return 0, {} end
  local spent = 0
  for _, entry in ipairs(entries) do
    spent = spent + entry_cost(s, entry)
    if spent > max_cost then return 0, {} end
  end
  return 1, entries
end

-- Presence (engine contract clause 8), per subject s, on the subject's Redis:
--   P:pz:<s>         zset: member ids, all scored 0, so a page is a
--                    ZRANGEBYLEX after the cursor (member-id order)
--   P:pm:<s>         hash: member id -> user .. "\31" .. info ('' = none)
--   P:pu:<s>         hash: user -> its members in s (HLEN = distinct users)
--   P:pl:<s>         zset: node id -> when its lease on its members of s
--                    ends (ms); a node renews it for all its subjects at
--                    once every third of a lease
--   P:pn:<s>:<node>  set: that node's members of s
-- A node whose lease has ended is pruned (its members removed, the user
-- counts with them, and counted in P:totals presence_expired) before any
-- join, page, count or renewal reads s, so a
-- dead node's members are never seen past its lease. Every key of s is
-- given three leases to live at each join and renewal: a subject whose
-- every node died is dropped by Redis itself.
local function pz(s) return P .. ':pz:' .. s end
local function pm(s) return P .. ':pm:' .. s end
local function pu(s) return P .. ':pu:' .. s end
local function pl(s) return P .. ':pl:' .. s end
local function pn(s, node) return P .. ':pn:' .. s .. ':' .. node end

-- Removes member id from s (not from its node's set); whether it was one.
local function presence_drop(s, id)
  local entry = redis.call('HGET', pm(s), id)
  if not entry then return false end
  redis.call('HDEL', pm(s), id)
  redis.call('ZREM', pz(s), id)
  local user = string.sub(entry, 1, string.find(entry, '\31', 1, true) - 1)
  if user ~= '' and redis.call('HINCRBY', pu(s), user, -1) <= 0 then
    redis.call('HDEL', pu(s), user)
  end
  return true
end

-- Removes the members of every node whose lease on s ended by now;
-- returns how many.
local function presence_prune(s, now)
  local expired = 0
  for _, node in ipairs(redis.call('ZRANGEBYSCORE', pl(s), '-inf', now)) do
    for _, id in ipairs(redis.call('SMEMBERS', pn(s, node))) do
      if presence_drop(s, id) then expired = expired + 1 end
    end
    redis.call('DEL', pn(s, node))
    redis.call('ZREM', pl(s), node)
  end
  if expired > 0 then redis.call('HINCRBY', TOTALS, 'presence_expired', expired) end
  return expired
end

-- Extends node's lease on s, and every key of s's life.
local function presence_keep(s, node, now, lease)
  redis.call('ZADD', pl(s), now + lease, node)
  for _, key in ipairs({pz(s), pm(s), pu(s), pl(s), pn(s, node)}) do
    redis.call('PEXPIRE', key, lease * 3)
  end
end

-- Makes id (of node, acting as user, with info) a member of s, counting
-- its user once; whether it was not one before.
local function presence_add(s, node, id, user, info)
  redis.call('SADD', pn(s, node), id)
  if redis.call('HEXISTS', pm(s), id) == 1 then return false end
  redis.call('ZADD', pz(s), 0, id)
  redis.call('HSET', pm(s), id, user .. '\31' .. info)
  if user ~= '' then redis.call('HINCRBY', pu(s), user, 1) end
  return true
end

-- Makes id (of node, acting as user, with info) a member of s unless s
-- holds max members; whether it is one now.
local function presence_join(s, node, id, user, info, max, now, lease)
  presence_prune(s, now)
  if redis.call('HEXISTS', pm(s), id) == 0 then
    if redis.call('ZCARD', pz(s)) >= max then return false end
    presence_add(s, node, id, user, info)
  end
  presence_keep(s, node, now, lease)
  return true
end
