//! The keeper's tests: follows settled only once every connection of the
//! follower applied them, connect-time reads in store order and in one
//! round trip, announcements a read already includes, missed changes and
//! failed reads tried again; over SQLite and a real Redis.

use std::time::{Duration, Instant};

use myriad_graph::{RedisStore, SqliteStore, StoreOptions};

use super::*;

fn user(id: u64) -> UserId {
    UserId::new(id).unwrap()
}

fn conn(worker: usize, conn: u32) -> ConnRequest {
    ConnRequest {
        worker,
        conn,
        life: 1,
        request: None,
    }
}

/// A keeper over an in-memory store and a hub of two workers whose
/// mailboxes the test reads itself.
fn keeper() -> (
    Feeds,
    Vec<Receiver<Event>>,
    Vec<mio::Poll>,
    tempfile::TempDir,
) {
    let (hub, mailboxes, polls) = crate::hub::test_hub(2, 65_536);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::in_memory(StoreOptions::default()).unwrap();
    let feeds = Keeper::start(
        Some(DataDir::lock(dir.path()).unwrap()),
        Box::new(store),
        None,
        hub,
        100,
    )
    .unwrap();
    (feeds, mailboxes, polls, dir)
}

fn feed_change(mailbox: &Receiver<Event>) -> FeedChange {
    match mailbox.recv_timeout(Duration::from_secs(10)) {
        Ok(Event::Feeds(change)) => *change,
        other => panic!("expected a feed change, got {other:?}"),
    }
}

#[test]
fn a_follow_is_settled_only_when_every_connection_of_the_follower_applied_it() {
    let (feeds, mailboxes, _polls, _dir) = keeper();
    feeds.presence.add(user(1), conn(0, 5));
    feeds.presence.add(user(1), conn(1, 9));
    feeds.presence.add(user(3), conn(0, 6));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let edges = vec![Edge::new(user(1), user(2)), Edge::new(user(1), user(4))];
    let mut applied = runtime
        .block_on(feeds.change(Direction::Follow, edges))
        .unwrap();
    assert_eq!(applied.changed, 2);
    assert!(feeds.known.contains(user(4)), "both ends are known at once");
    // One change per connection of the follower, none for user 3.
    let first = feed_change(&mailboxes[0]);
    let second = feed_change(&mailboxes[1]);
    assert!(mailboxes[0].is_empty() && mailboxes[1].is_empty());
    assert_eq!((first.to.conn, second.to.conn), (5, 9));
    assert_eq!(first.feeds, vec![user(2), user(4)]);
    assert_eq!(first.how, Apply::Add);
    // Not settled while either worker still holds its change.
    assert!(applied.settled.try_recv().is_err());
    drop(first);
    assert!(applied.settled.try_recv().is_err());
    drop(second);
    assert_eq!(applied.settled.try_recv(), Ok(()));
    feeds.stop();
}

#[test]
fn a_connecting_user_is_told_whom_it_follows_in_store_order() {
    let (feeds, mailboxes, _polls, _dir) = keeper();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let change =
        |edges: Vec<Edge>, direction| runtime.block_on(feeds.change(direction, edges)).unwrap();
    // Nobody is connected: settled at once.
    let applied = change(vec![Edge::new(user(1), user(2))], Direction::Follow);
    runtime.block_on(applied.settled).unwrap();
    // The connection is present before its read is asked for; a change
    // made after the read arrives after the read's answer.
    feeds.presence.add(user(1), conn(0, 5));
    feeds.opened(user(1), conn(0, 5));
    let unfollowed = change(vec![Edge::new(user(1), user(2))], Direction::Unfollow);
    assert_eq!(unfollowed.changed, 1);
    let opened = feed_change(&mailboxes[0]);
    assert_eq!((opened.feeds, opened.how), (vec![user(2)], Apply::Replace));
    assert!(opened.acks.is_empty());
    let unfollowed = feed_change(&mailboxes[0]);
    assert_eq!(
        (unfollowed.feeds, unfollowed.how),
        (vec![user(2)], Apply::Drop)
    );
    feeds.stop();
}

/// A keeper over the Redis store under a fresh prefix on `server`, as a
/// node with a change stream would run it, but driven by the test: it hands
/// the keeper what the change stream would have heard, in the order the
/// test needs. Also a second store under the same prefix: another node.
fn shared_keeper(
    server: &myriad_testkit::RedisServer,
    prefix: &str,
) -> (Keeper, Vec<Receiver<Event>>, Vec<mio::Poll>, RedisStore) {
    let urls = vec![server.url()];
    let open = || RedisStore::open(&urls, prefix, StoreOptions::default()).unwrap();
    let (keeper, mailboxes, polls) = driven_keeper(Box::new(open()), true);
    (keeper, mailboxes, polls, open())
}

/// A keeper over `store` that the test drives itself (no thread), and
/// the mailbox of its hub's one worker.
fn driven_keeper(
    store: Box<dyn Store>,
    shared: bool,
) -> (Keeper, Vec<Receiver<Event>>, Vec<mio::Poll>) {
    let (hub, mailboxes, polls) = crate::hub::test_hub(1, 65_536);
    let keeper = Keeper {
        _dir: None,
        store,
        hub,
        presence: Arc::default(),
        known: Arc::default(),
        stream: Arc::default(),
        max_following: 100,
        shared,
        applied: 0,
        waiting: BTreeMap::new(),
        ahead: HashMap::new(),
        owed: false,
        refused: Vec::new(),
        retry_at: None,
        queue: crossbeam_channel::never(),
        next: None,
    };
    (keeper, mailboxes, polls)
}

fn announced(text: &str) -> Announcement {
    Announcement::parse(text).unwrap()
}

#[test]
fn an_announcement_a_connect_time_read_includes_is_not_applied_again() {
    let server = myriad_testkit::RedisServer::start();
    let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
    // Another node follows and unfollows 1 -> 2 (changes 1 and 2)
    // before this node hears either.
    other.follow(&[Edge::new(user(1), user(2))]).unwrap();
    other.unfollow(&[Edge::new(user(1), user(2))]).unwrap();
    keeper.presence.add(user(1), conn(0, 5));
    keeper.open(&[(user(1), conn(0, 5))]);
    let opened = feed_change(&mailboxes[0]);
    assert_eq!((opened.how, opened.feeds), (Apply::Replace, vec![]));
    // The read includes both: hearing them changes nothing for it
    // (applying change 1 would subscribe it to @2 until change 2).
    keeper.heard(announced("1 f 0 1 2"));
    keeper.heard(announced("2 u 1 2"));
    assert!(mailboxes[0].is_empty());
    // A later change reaches it.
    other.follow(&[Edge::new(user(1), user(3))]).unwrap();
    keeper.heard(announced("3 f 0 1 3"));
    let later = feed_change(&mailboxes[0]);
    assert_eq!((later.how, later.feeds), (Apply::Add, vec![user(3)]));
    assert!(keeper.ahead.is_empty(), "forgotten once passed");
}

/// How many `EXEC`s (one per read of following lists) `server` ran.
fn execs(server: &myriad_testkit::RedisServer) -> u64 {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_exec:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[test]
fn connects_queued_together_are_read_in_one_round_trip_in_order() {
    let server = myriad_testkit::RedisServer::start();
    let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
    other.follow(&[Edge::new(user(1), user(2))]).unwrap();
    let (jobs, queue) = crossbeam_channel::unbounded();
    keeper.queue = queue;
    let open = |id: u32| Job::Open {
        user: user(u64::from(id)),
        to: conn(0, id),
    };
    // 100 connects, a job of another kind, then 300 connects.
    for id in 1..=100 {
        jobs.send(open(id)).unwrap();
    }
    jobs.send(Job::Refused {
        user: user(1),
        to: conn(0, 1),
    })
    .unwrap();
    for id in 101..=400 {
        jobs.send(open(id)).unwrap();
    }
    let before = execs(&server);
    let first = keeper.queue.recv().unwrap();
    assert!(keeper.handle(first).is_continue());
    assert_eq!(execs(&server) - before, 1, "100 connects, one read");
    let told: Vec<FeedChange> = mailboxes[0]
        .try_iter()
        .map(|e| match e {
            Event::Feeds(change) => *change,
            other => panic!("expected a feed change, got {other:?}"),
        })
        .collect();
    let conns: Vec<u32> = told.iter().map(|c| c.to.conn).collect();
    assert_eq!(conns, (1..=100).collect::<Vec<_>>());
    assert_eq!(told[0].feeds, vec![user(2)]);
    assert!(told[1..].iter().all(|c| c.feeds.is_empty()));
    // The other job is next, before any later connect.
    assert!(matches!(keeper.next, Some(Job::Refused { .. })));
    let refusal = keeper.next.take().unwrap();
    assert!(keeper.handle(refusal).is_continue());
    assert!(mailboxes[0].is_empty(), "a refusal is read again later");
    // Then at most READ_BATCH connects a read.
    let first = keeper.queue.recv().unwrap();
    assert!(keeper.handle(first).is_continue());
    assert_eq!(execs(&server) - before, 2);
    assert_eq!(mailboxes[0].try_iter().count(), READ_BATCH);
    assert!(keeper.next.is_none());
    assert_eq!(keeper.queue.len(), 300 - READ_BATCH);
}

#[test]
fn a_write_settles_when_its_own_announcement_is_applied() {
    let server = myriad_testkit::RedisServer::start();
    let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
    keeper.presence.add(user(1), conn(0, 5));
    other.follow(&[Edge::new(user(7), user(8))]).unwrap();
    let mut applied = keeper
        .change(Direction::Follow, vec![Edge::new(user(1), user(2))])
        .unwrap();
    assert!(keeper.known.contains(user(2)));
    // Change 2 waits for its announcement, which comes after change 1's.
    assert!(mailboxes[0].is_empty());
    keeper.heard(announced("1 f 0 7 8"));
    assert!(applied.settled.try_recv().is_err());
    keeper.heard(announced("2 f 0 1 2"));
    let change = feed_change(&mailboxes[0]);
    assert_eq!(
        (change.how, change.feeds.clone()),
        (Apply::Add, vec![user(2)])
    );
    assert!(applied.settled.try_recv().is_err());
    drop(change);
    assert_eq!(applied.settled.try_recv(), Ok(()));
}

#[test]
fn a_missed_change_is_read_again_and_settles_the_writes_it_covers() {
    let server = myriad_testkit::RedisServer::start();
    let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
    keeper.presence.add(user(1), conn(0, 5));
    keeper.presence.add(user(4), conn(0, 6));
    // This node's write (change 1), then another's (change 2), whose
    // announcements never come: the subscription was down.
    let mut applied = keeper
        .change(Direction::Follow, vec![Edge::new(user(1), user(2))])
        .unwrap();
    other.follow(&[Edge::new(user(4), user(5))]).unwrap();
    other.add_users(&[user(9)]).unwrap();
    // Change 4 is heard: 2 and 3 were missed.
    other.follow(&[Edge::new(user(1), user(3))]).unwrap();
    keeper.heard(announced("4 f 0 1 3"));
    let mut replaced: Vec<FeedChange> =
        vec![feed_change(&mailboxes[0]), feed_change(&mailboxes[0])];
    assert!(mailboxes[0].is_empty());
    replaced.sort_by_key(|c| c.to.conn);
    assert_eq!(replaced[0].how, Apply::Replace);
    assert_eq!(replaced[0].feeds, vec![user(2), user(3)]);
    assert_eq!(replaced[1].feeds, vec![user(5)]);
    assert!(keeper.known.contains(user(9)), "known users read again");
    assert_eq!(keeper.applied, 4);
    assert_eq!(keeper.stream.resyncs.load(Ordering::Relaxed), 1);
    assert!(applied.settled.try_recv().is_err());
    drop(replaced);
    assert_eq!(applied.settled.try_recv(), Ok(()));
    // What it read is not heard again.
    keeper.heard(announced("4 f 0 1 3"));
    assert!(mailboxes[0].is_empty());
}

#[test]
fn a_connect_time_read_that_fails_is_tried_again_without_a_shared_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(myriad_graph::sqlite::FILE_NAME);
    let mut store = SqliteStore::open(&path, StoreOptions::default()).unwrap();
    store.follow(&[Edge::new(user(1), user(2))]).unwrap();
    let (mut keeper, mailboxes, _polls) = driven_keeper(Box::new(store), false);
    // Another process takes the table away: the keeper's reads fail
    // as SQLite fails them.
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute_batch("ALTER TABLE follows RENAME TO follows_away")
        .unwrap();
    keeper.presence.add(user(1), conn(0, 5));
    keeper.open(&[(user(1), conn(0, 5))]);
    assert!(
        mailboxes[0].is_empty(),
        "no list is told from a failed read"
    );
    assert!(keeper.retry_at.is_some(), "a retry is due");
    // Still failing: tried again later, once per connection.
    keeper.retry();
    assert!(mailboxes[0].is_empty());
    assert_eq!(keeper.refused.len(), 1);
    other
        .execute_batch("ALTER TABLE follows_away RENAME TO follows")
        .unwrap();
    keeper.retry();
    let again = feed_change(&mailboxes[0]);
    assert_eq!((again.to.conn, again.how), (5, Apply::Replace));
    assert_eq!(again.feeds, vec![user(2)]);
    assert!(keeper.retry_at.is_none() && keeper.refused.is_empty());
}

/// The engine refused a feed of `to`'s, as the keeper hears it.
fn refused(keeper: &mut Keeper, user: UserId, to: ConnRequest) {
    assert!(keeper.handle(Job::Refused { user, to }).is_continue());
}

#[test]
fn a_connection_whose_feed_was_refused_is_told_its_feeds_again_while_open() {
    let server = myriad_testkit::RedisServer::start();
    let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
    other.follow(&[Edge::new(user(1), user(2))]).unwrap();
    keeper.presence.add(user(1), conn(0, 5));
    refused(&mut keeper, user(1), conn(0, 5));
    // Each refused feed of a connection says so; it is read once.
    refused(&mut keeper, user(1), conn(0, 5));
    // A connection gone since is not told.
    refused(&mut keeper, user(3), conn(0, 6));
    assert_eq!(keeper.refused.len(), 2);
    assert!(mailboxes[0].is_empty(), "not before the pause");
    let at = keeper.retry_at.expect("a retry is due");
    assert!(at > Instant::now() + RETRY / 2);
    keeper.retry();
    let again = feed_change(&mailboxes[0]);
    assert_eq!((again.to.conn, again.how), (5, Apply::Replace));
    assert_eq!(again.feeds, vec![user(2)]);
    assert!(mailboxes[0].is_empty());
    assert!(keeper.retry_at.is_none() && keeper.refused.is_empty());
}
