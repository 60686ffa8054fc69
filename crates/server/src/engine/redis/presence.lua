-- Presence but the join (which read.lua makes with its attach):
-- ARGV = base (lib.lua), mode, then by mode
--   'leave', subject, node, member id           -> {left (0 or 1)}
--   'page', subject, after ('' = from the start), limit
--                                               -> {more (0 or 1), id, entry, ...}
--   'stats', subject                            -> {connections, users}
--   'renew', node, lease ms, then per subject: subject, how many of its
--            members Redis took from node       -> {members ever expired on
--                                                   this Redis, then the
--                                                   place (1-based) of every
--                                                   subject holding fewer}
--   'restore', node, lease ms, then per subject: subject, n, then n times
--            member id, user, info              -> {members put back}
-- A renewal never makes a member: a subject where Redis holds fewer of
-- node's members than node says it took lost them (a restart with nothing
-- on disk, a failover that lost the newest writes, node's own lease ended
-- while it could not renew), and node then restores those it still holds,
-- never one that left, past the cap if need be: they are live already.
-- Pruning a node whose lease ended comes first in each (lib.lua).
local mode = ARGV[2]
local now = now_ms()
if mode == 'leave' then
  local s, node, id = ARGV[3], ARGV[4], ARGV[5]
  local left = presence_drop(s, id)
  redis.call('SREM', pn(s, node), id)
  if redis.call('SCARD', pn(s, node)) == 0 then redis.call('ZREM', pl(s), node) end
  if left then return {1} end
  return {0}
elseif mode == 'page' then
  local s, limit = ARGV[3], tonumber(ARGV[5])
  presence_prune(s, now)
  local from = '-'
  if ARGV[4] ~= '' then from = '(' .. ARGV[4] end
  local ids = redis.call('ZRANGEBYLEX', pz(s), from, '+', 'LIMIT', 0, limit + 1)
  local reply = {0}
  if #ids > limit then
    reply[1] = 1
    ids[#ids] = nil
  end
  -- HMGET in chunks: unpack has a bound on how many values it spreads.
  for first = 1, #ids, 1000 do
    local chunk = {unpack(ids, first, math.min(first + 999, #ids))}
    local entries = redis.call('HMGET', pm(s), unpack(chunk))
    for i, id in ipairs(chunk) do
      reply[#reply + 1] = id
      reply[#reply + 1] = entries[i]
    end
  end
  return reply
elseif mode == 'stats' then
  local s = ARGV[3]
  presence_prune(s, now)
  return {redis.call('ZCARD', pz(s)), redis.call('HLEN', pu(s))}
elseif mode == 'renew' then
  local node, lease = ARGV[3], tonumber(ARGV[4])
  local reply = {0}
  for i = 5, #ARGV, 2 do
    local s, taken = ARGV[i], tonumber(ARGV[i + 1])
    presence_prune(s, now)
    local held = redis.call('SCARD', pn(s, node))
    if held > 0 then presence_keep(s, node, now, lease) end
    if held < taken then reply[#reply + 1] = (i - 3) / 2 end
  end
  reply[1] = tonumber(redis.call('HGET', TOTALS, 'presence_expired') or '0')
  return reply
elseif mode == 'restore' then
  local node, lease = ARGV[3], tonumber(ARGV[4])
  local put, i = 0, 5
  while i <= #ARGV do
    local s, n = ARGV[i], tonumber(ARGV[i + 1])
    presence_prune(s, now)
    for m = i + 2, i + 1 + 3 * n, 3 do
      if presence_add(s, node, ARGV[m], ARGV[m + 1], ARGV[m + 2]) then put = put + 1 end
    end
    presence_keep(s, node, now, lease)
    i = i + 2 + 3 * n
  end
  return {put}
end
return redis.error_reply('unknown presence mode ' .. tostring(mode))
