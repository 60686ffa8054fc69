-- Writes one part of a bulk change (ARGV[4]) where nothing reads it until
-- the change is committed. Answers {OK, the part's index}.
if redis.call('HGET', JOURNAL, 'state') ~= 'staging' then
  return redis.error_reply('ERR bulk change is not staging')
end
local index = redis.call('HINCRBY', JOURNAL, 'staged', 1) - 1
redis.call('SET', P .. 'bulk:' .. index, ARGV[4])
return {OK, index}
