-- The lifecycle hooks' tally (hooks/tally.rs has the contract): which
-- nodes hold each user or subject, and the pending let-go of one nobody
-- holds. Every key is named in KEYS; a key's two share its hash tag.
-- ARGV[1] is the mode; then, by mode:
--   'up'      KEYS here, down; node        -> 1 first, 2 returned, 0 held
--   'down'    KEYS here, down; node, generation, marker ttl ms
--                                          -> 1 let go (pending), 0 not
--   'confirm' KEYS here, down; generation  -> 1 confirmed (once), 0 not
--   'drop'    KEYS here, down; dead node, generation, marker ttl ms
--                                          -> 1 let go (pending) or the
--                                             dead node's pending taken
--                                             over, 0 not
-- A generation is its node's id, '-', and a counter.
--   'renew'   KEYS leases; node, lease ms  -> '1' if node had no lease
--                                             (else '0'), then the nodes
--                                             whose lease ended
-- `here` is a hash of the nodes holding the key (a node holds it or not:
-- an up it makes again, after a failed call or a lost lease, is no
-- change); `down` holds the pending let-go's generation while nobody
-- holds the key.
local mode = ARGV[1]
if mode == 'up' then
  local here, down, node = KEYS[1], KEYS[2], ARGV[2]
  if redis.call('HSETNX', here, node, 1) == 0 or redis.call('HLEN', here) ~= 1 then return 0 end
  if redis.call('DEL', down) == 1 then return 2 end
  return 1
elseif mode == 'down' or mode == 'drop' then
  local here, down, node = KEYS[1], KEYS[2], ARGV[2]
  if redis.call('HEXISTS', here, node) == 0 then
    -- A dead node's own pending let-go, which it will never confirm: the
    -- sweeper takes it over under a generation of its own.
    local pending = redis.call('GET', down)
    if mode == 'drop' and pending and string.sub(pending, 1, #node + 1) == node .. '-' then
      redis.call('SET', down, ARGV[3], 'PX', ARGV[4])
      return 1
    end
    return 0
  end
  redis.call('HDEL', here, node)
  if redis.call('EXISTS', here) == 1 then return 0 end
  redis.call('SET', down, ARGV[3], 'PX', ARGV[4])
  return 1
elseif mode == 'confirm' then
  local here, down = KEYS[1], KEYS[2]
  if redis.call('GET', down) ~= ARGV[2] or redis.call('EXISTS', here) == 1 then return 0 end
  redis.call('DEL', down)
  return 1
elseif mode == 'renew' then
  local leases, node, lease = KEYS[1], ARGV[2], tonumber(ARGV[3])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lost = redis.call('ZADD', leases, now + lease, node)
  local reply = redis.call('ZRANGEBYSCORE', leases, '-inf', '(' .. now)
  table.insert(reply, 1, tostring(lost))
  return reply
end
return redis.error_reply('unknown lifecycle mode ' .. tostring(mode))
