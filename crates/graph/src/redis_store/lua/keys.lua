-- Opens every script: the store's keys and the answers' codes (the Rust
-- side's `Reply`). ARGV[1] is the store's prefix; every key is under it.
local P = ARGV[1]
local LOCK = P .. 'bulk:lock'
local JOURNAL = P .. 'bulk:journal'
local OK, LIMIT, BUSY, RECOVER, LOST = 0, 1, 2, 3, 4
-- Values per variadic call: Lua's unpack refuses about 8,000.
local SLICE = 1000
-- Clause 6: gives a change the next number of the store's one sequence
-- and announces it under that number on the store's channel, in the
-- script that applies it, so the announcements' order is the store's
-- order (`announce.rs` has the text). Answers the number.
local function announce(text)
  local change = redis.call('INCR', P .. 'changes:last')
  redis.call('PUBLISH', P .. 'changes', change .. ' ' .. text)
  return change
end
