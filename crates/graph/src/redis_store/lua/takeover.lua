-- Takes over what a bulk change left when its client went silent past its
-- lease: the lock for the token ARGV[2], lease ARGV[3] ms. Answers
-- {OK, 0} when nothing was left, {OK, 1, 1 if committed else 0} once this
-- client holds it, {BUSY} while the lock is still someone's.
if redis.call('EXISTS', LOCK) == 1 then return {BUSY} end
if redis.call('EXISTS', JOURNAL) == 0 then return {OK, 0} end
redis.call('SET', LOCK, ARGV[2], 'PX', ARGV[3])
local committed = redis.call('HGET', JOURNAL, 'state') == 'committed'
return {OK, 1, committed and 1 or 0}
