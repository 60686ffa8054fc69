-- Applies the next part of a committed bulk change and forgets it, in one
-- step; after the last part the journal and the lock go too. A part is
-- its kind, a newline, then ids separated by spaces: single users, or
-- pairs whose first id owns the list the second goes into, sorted by the
-- first. Answers {OK, what the part changed, 0}, or after the last part
-- {OK, what it changed, 1, the change number}: the whole change is
-- announced once, as a reread, since its edges may be millions.
local state = redis.call('HMGET', JOURNAL, 'state', 'staged', 'applied')
if state[1] ~= 'committed' then
  return redis.error_reply('ERR bulk change is not committed')
end
local staged, index = tonumber(state[2]), tonumber(state[3])
-- Which list the second id of a pair goes into, and how.
local PAIRS = {
  follow = {list = 'following:', add = true, edges = 1},
  followed = {list = 'followers:', add = true, edges = 0},
  unfollow = {list = 'following:', add = false, edges = -1},
  unfollowed = {list = 'followers:', add = false, edges = 0},
}
local count = 0
if index < staged then
  local key = P .. 'bulk:' .. index
  local part = redis.call('GET', key)
  if not part then
    return redis.error_reply('ERR bulk change lost its part ' .. index)
  end
  local newline = string.find(part, '\n', 1, true)
  local kind, ids = string.sub(part, 1, newline - 1), string.sub(part, newline + 1)
  if kind == 'users' then
    local args = {}
    for id in string.gmatch(ids, '%d+') do
      args[#args + 1] = id
      args[#args + 1] = id
      if #args >= SLICE then
        count = count + redis.call('ZADD', P .. 'users', unpack(args))
        args = {}
      end
    end
    if #args > 0 then count = count + redis.call('ZADD', P .. 'users', unpack(args)) end
  else
    local how = PAIRS[kind]
    if not how then return redis.error_reply('ERR bulk part of unknown kind') end
    local command = how.add and 'ZADD' or 'ZREM'
    local owner, args = nil, {}
    -- One variadic call per owner's run (or slice of it).
    local function flush()
      if #args > 0 then
        count = count + redis.call(command, P .. how.list .. owner, unpack(args))
        args = {}
      end
    end
    for first, second in string.gmatch(ids, '(%d+) (%d+)') do
      if first ~= owner or #args >= SLICE then
        flush()
        owner = first
      end
      -- A sorted set's score is the id itself, so pages come in id order.
      if how.add then args[#args + 1] = second end
      args[#args + 1] = second
    end
    flush()
    if how.edges ~= 0 and count > 0 then
      redis.call('INCRBY', P .. 'edges', how.edges * count)
    end
  end
  redis.call('DEL', key)
  index = index + 1
  redis.call('HSET', JOURNAL, 'applied', index)
end
if index >= staged then
  redis.call('DEL', JOURNAL, LOCK)
  return {OK, count, 1, announce('r')}
end
return {OK, count, 0}
