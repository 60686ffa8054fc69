-- One batch of users and edges, all or nothing: the refusal is decided
-- before the first write. ARGV: prefix, max_following, the number of
-- users U, U users, then follower-followee pairs. Answers
-- {OK, edges added, users added, its change number} or {LIMIT, the
-- lowest user over}, which announces nothing.
local max = tonumber(ARGV[2])
local first = 4 + tonumber(ARGV[3])
-- Each follower's distinct followees, and the followers in batch order.
local followees, followers, seen = {}, {}, {}
for i = first, #ARGV, 2 do
  local follower, followee = ARGV[i], ARGV[i + 1]
  local list = followees[follower]
  if not list then
    list = {}
    followees[follower] = list
    followers[#followers + 1] = follower
  end
  local pair = follower .. ' ' .. followee
  if not seen[pair] then
    seen[pair] = true
    list[#list + 1] = followee
  end
end
-- Ids are at most 2^53 - 1, which a Lua number holds exactly.
table.sort(followers, function(a, b) return tonumber(a) < tonumber(b) end)
for _, follower in ipairs(followers) do
  if over_limit(max, follower, followees[follower]) then
    return {LIMIT, tonumber(follower)}
  end
end
local users = P .. 'users'
local added_users = 0
for i = 4, first - 1 do
  added_users = added_users + redis.call('ZADD', users, ARGV[i], ARGV[i])
end
local added = 0
for _, follower in ipairs(followers) do
  local following = P .. 'following:' .. follower
  for _, followee in ipairs(followees[follower]) do
    if redis.call('ZADD', following, followee, followee) == 1 then
      redis.call('ZADD', P .. 'followers:' .. followee, follower, follower)
      added = added + 1
    end
    redis.call('ZADD', users, follower, follower, followee, followee)
  end
end
if added > 0 then redis.call('INCRBY', P .. 'edges', added) end
return {OK, added, added_users, announce('f ' .. table.concat(ARGV, ' ', 3))}
