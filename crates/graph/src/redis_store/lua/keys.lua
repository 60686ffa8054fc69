-- Opens every script: the store's keys and the answers' codes (the Rust
-- side's `Reply`). ARGV[1] is the store's prefix; every key is under it.
local P = ARGV[1]
local LOCK = P .. 'bulk:lock'
local JOURNAL = P .. 'bulk:journal'
local OK, LIMIT, BUSY, RECOVER, LOST = 0, 1, 2, 3, 4
-- Values per variadic call: Lua's unpack refuses about 8,000.
local SLICE = 1000
