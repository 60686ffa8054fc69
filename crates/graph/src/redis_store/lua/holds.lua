-- A step of a bulk change runs only for the client whose token is in the
-- lock (ARGV[2]), and renews that client's lease (ARGV[3], milliseconds).
if redis.call('GET', LOCK) ~= ARGV[2] then return {LOST} end
redis.call('PEXPIRE', LOCK, ARGV[3])
