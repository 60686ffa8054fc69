-- A write that is not part of a bulk change waits while one holds the
-- store, and never runs over the remains of one whose client went silent
-- (those are finished or discarded first).
if redis.call('EXISTS', LOCK) == 1 then return {BUSY} end
if redis.call('EXISTS', JOURNAL) == 1 then return {RECOVER} end
