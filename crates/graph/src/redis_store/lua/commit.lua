-- The point of no return: from here the change is finished, by this
-- client or by one that takes it over, never discarded.
redis.call('HSET', JOURNAL, 'state', 'committed')
return {OK}
