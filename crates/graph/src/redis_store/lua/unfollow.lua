-- One batch of unfollows, all in one step. ARGV: prefix, then
-- follower-followee pairs. Answers {OK, edges removed, its change number}.
local removed = 0
for i = 2, #ARGV, 2 do
  local follower, followee = ARGV[i], ARGV[i + 1]
  if redis.call('ZREM', P .. 'following:' .. follower, followee) == 1 then
    redis.call('ZREM', P .. 'followers:' .. followee, follower)
    removed = removed + 1
  end
end
if removed > 0 then redis.call('DECRBY', P .. 'edges', removed) end
return {OK, removed, announce('u ' .. table.concat(ARGV, ' ', 2))}
