-- Clause 3: whether `follower`, once it also follows each of `followees`
-- (distinct ids), would follow more than `max` users. Users it follows
-- already count once.
local function over_limit(max, follower, followees)
  local key = P .. 'following:' .. follower
  local count = redis.call('ZCARD', key)
  if count + #followees <= max then return false end
  for _, followee in ipairs(followees) do
    if not redis.call('ZSCORE', key, followee) then count = count + 1 end
  end
  return count > max
end
