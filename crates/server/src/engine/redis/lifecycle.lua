-- The lifecycle hooks' tally (hooks/tally.rs has the contract): which
-- nodes hold each user or subject, and the pending let-go of one nobody
-- holds. Every key is named in KEYS; a key's two share its hash tag.
-- ARGV[1] is the mode; then, by mode:
--   'up'      KEYS here, down; node, call  -> 1 first, 2 returned, 0 held
--   'down'    KEYS here, down; node, generation, marker ttl ms
--                                          -> the generation when nobody
--                                             holds the key now, else ''
--   'confirm' KEYS here, down; generation, marker ttl ms
--                                          -> 1 confirmed, 0 not
--   'drop'    KEYS here, down; dead node, generation, marker ttl ms
--                                          -> the generation when nobody
--                                             holds the key now or the
--                                             dead node's pending let-go
--                                             is taken over, else ''
--   'renew'   KEYS leases; node, lease ms  -> '1' if node had no lease
--                                             (else '0'), then the nodes
--                                             whose lease ended
-- `here` is a hash of the nodes holding the key, each with the call that
-- made it hold and that call's answer ('<call>:<answer>'), so that a call
-- made again (its reply lost) answers as it did. `down` holds the pending
-- let-go's generation while nobody holds the key, then 'done:' and it once
-- confirmed, for a confirm made again. A generation is its node's id, '-',
-- and more.
local mode = ARGV[1]
local function pending(down)
  local marker = redis.call('GET', down)
  if marker and string.sub(marker, 1, 5) ~= 'done:' then return marker end
  return nil
end
if mode == 'up' then
  local here, down, node, call = KEYS[1], KEYS[2], ARGV[2], ARGV[3]
  local mark = redis.call('HGET', here, node)
  if mark then
    local made, answer = string.match(mark, '^(.*):(%d)$')
    if made == call then return tonumber(answer) end
    return 0
  end
  local answer = 0
  if redis.call('EXISTS', here) == 0 then
    answer = 1
    if pending(down) then answer = 2 end
    redis.call('DEL', down)
  end
  redis.call('HSET', here, node, call .. ':' .. answer)
  return answer
elseif mode == 'down' or mode == 'drop' then
  local here, down, node, generation = KEYS[1], KEYS[2], ARGV[2], ARGV[3]
  if redis.call('HEXISTS', here, node) == 0 then
    local marker = pending(down)
    -- This very let-go, made before its reply was lost.
    if mode == 'down' and marker == generation then return generation end
    -- A dead node's own pending let-go, which it will never confirm: the
    -- sweeper takes it over under a generation of its own.
    if mode == 'drop' and marker and string.sub(marker, 1, #node + 1) == node .. '-' then
      redis.call('SET', down, generation, 'PX', ARGV[4])
      return generation
    end
    return ''
  end
  redis.call('HDEL', here, node)
  if redis.call('EXISTS', here) == 1 then return '' end
  redis.call('SET', down, generation, 'PX', ARGV[4])
  return generation
elseif mode == 'confirm' then
  local here, down, generation = KEYS[1], KEYS[2], ARGV[2]
  local marker = redis.call('GET', down)
  if marker == 'done:' .. generation then return 1 end
  if marker ~= generation or redis.call('EXISTS', here) == 1 then return 0 end
  redis.call('SET', down, 'done:' .. generation, 'PX', ARGV[3])
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
