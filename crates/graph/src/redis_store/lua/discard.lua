-- Throws away an uncommitted bulk change, at most SLICE parts a step;
-- the last step drops the journal and the lock. Answers {OK, parts left}.
local state = redis.call('HMGET', JOURNAL, 'state', 'staged')
if state[1] ~= 'staging' then
  return redis.error_reply('ERR only a staging bulk change can be discarded')
end
local staged = tonumber(state[2])
local stop = math.max(0, staged - SLICE)
for index = staged - 1, stop, -1 do
  redis.call('UNLINK', P .. 'bulk:' .. index)
end
if stop == 0 then
  redis.call('DEL', JOURNAL, LOCK)
else
  redis.call('HSET', JOURNAL, 'staged', stop)
end
return {OK, stop}
