-- Clause 3 for a bulk change, before anything of it is staged. ARGV[4] is
-- max_following, then groups: a follower, the count k of its followees,
-- and k distinct followees, followers ascending. Answers {OK} or
-- {LIMIT, the first follower over}.
local max = tonumber(ARGV[4])
local i = 5
while i <= #ARGV do
  local follower, k = ARGV[i], tonumber(ARGV[i + 1])
  local list = {}
  for j = 1, k do list[j] = ARGV[i + 1 + j] end
  if over_limit(max, follower, list) then return {LIMIT, tonumber(follower)} end
  i = i + 2 + k
end
return {OK}
