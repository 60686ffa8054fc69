-- Starts a bulk change (after the guard): takes the lock for the token
-- ARGV[2] with a lease of ARGV[3] ms and opens an empty journal. Answers
-- {OK, edges the store holds}.
redis.call('SET', LOCK, ARGV[2], 'PX', ARGV[3])
redis.call('HSET', JOURNAL, 'state', 'staging', 'staged', 0, 'applied', 0)
return {OK, tonumber(redis.call('GET', P .. 'edges') or '0')}
