//! A connection's pub/sub session: what it is subscribed to, how far it has
//! got in each subject, and who it is, apart from the transport that
//! carries it.
//!
//! The worker keeps one per connection in its slab, so it is sized like the
//! connection: one subject inline, and everything else behind a pointer
//! that is null unless used. The cursor exists only for transports that
//! hand the client its positions as one value (Server-Sent Events ids,
//! long-poll answers; see `myriad_protocol::cursor`): a WebSocket client
//! reads the position of every message itself. The identity is the user a
//! connection acts as, and what its token allows: from a verified token
//! (see `crate::auth`), or from `?user=` on a node that checks no tokens
//! (see `worker::feeds`).

use std::sync::Arc;

use myriad_graph::UserId;

use crate::auth::Access;
use myriad_protocol::cursor::write_cursor;
use myriad_protocol::position::Position;
use myriad_protocol::subject::is_feed;
use smallvec::SmallVec;

/// Who a connection acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user, whose feed `send` publishes to.
    pub user: UserId,
    /// Feed subscriptions the server made for the user's graph (its own
    /// feed and those it follows), which `max_following` bounds instead of
    /// `max_subscriptions`.
    pub graph_feeds: u32,
    /// Feed subscriptions the client asked for itself: counted against
    /// `max_subscriptions`, and held to the token's grants at `refresh`
    /// like any subject, where the graph's own feeds are not.
    pub client_feeds: Vec<Arc<str>>,
    /// What the connection's token allows, until when; `None` for a user
    /// named by `?user=` on a node that checks no tokens.
    pub access: Option<Access>,
    /// Whether the connection was opened as its user, and so keeps the
    /// user online for the lifecycle hooks until it closes; a caller made
    /// to act as a user for one request does not.
    pub online: bool,
}

impl Session {
    /// Subscriptions that count against `max_subscriptions`: all but the
    /// feeds the server made for the user's graph.
    pub fn client_subscriptions(&self) -> usize {
        let graph = self.identity.as_ref().map_or(0, |i| i.graph_feeds as usize);
        self.subscriptions.len().saturating_sub(graph)
    }

    /// What the connection's token allows; `None` without a token.
    pub fn access(&self) -> Option<&Access> {
        self.identity.as_ref().and_then(|i| i.access.as_ref())
    }

    /// Records that the client itself subscribed to the feed `subject`
    /// (held already); see [`Identity::client_feeds`].
    pub fn feed_subscribed(&mut self, subject: &str) {
        let held = self
            .subscriptions
            .iter()
            .find(|s| &***s == subject)
            .cloned();
        if let (Some(identity), Some(name)) = (self.identity.as_mut(), held) {
            identity.client_feeds.push(name);
        }
    }

    /// Records that the feed subscription `subject` ended, whoever had made
    /// it; see [`Identity::graph_feeds`] and [`Identity::client_feeds`].
    pub fn feed_dropped(&mut self, subject: &str) {
        let Some(identity) = self.identity.as_mut() else {
            return;
        };
        match identity.client_feeds.iter().position(|s| &**s == subject) {
            Some(i) => {
                identity.client_feeds.swap_remove(i);
            }
            None => identity.graph_feeds = identity.graph_feeds.saturating_sub(1),
        }
    }

    /// Whether `subject` is a feed the server made for the user's graph.
    pub fn is_graph_feed(&self, subject: &str) -> bool {
        is_feed(subject)
            && self
                .identity
                .as_ref()
                .is_some_and(|i| !i.client_feeds.iter().any(|s| &**s == subject))
    }
}

/// What a session keeps for a transport that resumes by cursor.
#[derive(Debug)]
struct Cursor {
    /// The position reached in each subject of the opening request, in
    /// its order: one entry per subject of the URL, whatever became of it.
    positions: SmallVec<[Option<Position>; 1]>,
    /// Entries of `positions` whose subscription ended (the engine could
    /// not make it), ascending. Each keeps the entry the request brought,
    /// so that every cursor handed out still fits the URL, and a resume
    /// tries that subject again from where the client was. Empty (no
    /// allocation) unless a subscribe failed.
    dropped: Vec<u32>,
    /// Subjects of the opening request whose subscription the engine has
    /// not answered yet. Until it is 0 the cursor is not handed out in
    /// pieces: a stream of N subjects would otherwise write N cursors of N
    /// entries while it opens (see `transport::sse`).
    unanswered: u32,
    /// The cursor moved where no event carried it (the opening ended, a
    /// stream broke): the worker hands it out once its turn is done.
    owed: bool,
}

impl Cursor {
    /// The entry of the `held`-th subscription: its index among the
    /// entries not dropped.
    fn entry(&self, held: usize) -> u32 {
        let mut entry = held as u32;
        for &d in &self.dropped {
            if d > entry {
                break;
            }
            entry += 1;
        }
        entry
    }
}

/// A connection's subscriptions, cursor and identity.
#[derive(Debug, Default)]
pub struct Session {
    /// Subjects held (attached or attaching), sharing their names with the
    /// registry and the hub. Kept in the order they were added, which is the
    /// order of the cursor's entries (less those dropped).
    pub subscriptions: SmallVec<[Arc<str>; 1]>,
    /// Kept only for transports that resume by cursor.
    cursor: Option<Box<Cursor>>,
    /// `None` for anonymous connections. Boxed: most connections have none,
    /// and a null pointer is the smallest way to say so.
    pub identity: Option<Box<Identity>>,
}

impl Session {
    pub fn holds(&self, subject: &str) -> bool {
        self.subscriptions.iter().any(|s| &**s == subject)
    }

    /// Drops `subject`; returns the name it held, if it held it.
    /// With a cursor, the subject's entry stays as it was (see
    /// [`Cursor::dropped`]).
    pub fn remove(&mut self, subject: &str) -> Option<Arc<str>> {
        let i = self.subscriptions.iter().position(|s| &**s == subject)?;
        if let Some(cursor) = self.cursor.as_mut() {
            let entry = cursor.entry(i);
            let at = cursor.dropped.partition_point(|&d| d < entry);
            cursor.dropped.insert(at, entry);
        }
        Some(self.subscriptions.remove(i))
    }

    /// Drops every subscription (and the cursor with them); returns them.
    pub fn take_all(&mut self) -> SmallVec<[Arc<str>; 1]> {
        self.cursor = None;
        std::mem::take(&mut self.subscriptions)
    }

    /// Replaces the held name equal to `name` with `name` itself, so that
    /// one allocation of a subject serves every holder.
    pub fn adopt_name(&mut self, name: &Arc<str>) {
        if let Some(held) = self.subscriptions.iter_mut().find(|s| ***s == **name) {
            *held = Arc::clone(name);
        }
    }

    /// Starts keeping a cursor, beginning at `start`: one entry per
    /// subscription about to be added, in the order they will be added.
    pub fn keep_cursor(&mut self, start: &[Option<Position>]) {
        debug_assert!(
            self.subscriptions.is_empty(),
            "cursor set before subscribing"
        );
        self.cursor = Some(Box::new(Cursor {
            positions: start.iter().copied().collect(),
            dropped: Vec::new(),
            unanswered: u32::try_from(start.len()).unwrap_or(u32::MAX),
            owed: false,
        }));
    }

    /// Records that the engine answered one subject of the opening request
    /// (attached or refused). True for the last one: from then on the
    /// cursor is [settled](Self::cursor_settled).
    pub fn answered(&mut self) -> bool {
        match self.cursor.as_mut() {
            Some(cursor) if cursor.unanswered > 0 => {
                cursor.unanswered -= 1;
                cursor.unanswered == 0
            }
            _ => false,
        }
    }

    /// Records that the client must be told the cursor, which moved with
    /// no event carrying it. True if it was not owed already.
    pub fn owe_cursor(&mut self) -> bool {
        match self.cursor.as_mut() {
            Some(cursor) if !cursor.owed => {
                cursor.owed = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the cursor was owed; it is not any more.
    pub fn take_owed_cursor(&mut self) -> bool {
        self.cursor
            .as_mut()
            .is_some_and(|c| std::mem::take(&mut c.owed))
    }

    /// Whether the session keeps a cursor and every subject it opened with
    /// has been answered, so the cursor is worth telling after each change.
    pub fn cursor_settled(&self) -> bool {
        self.cursor.as_ref().is_some_and(|c| c.unanswered == 0)
    }

    /// Whether this session keeps a cursor.
    pub fn keeps_cursor(&self) -> bool {
        self.cursor.is_some()
    }

    /// How many subjects the cursor covers (0 without one).
    pub fn cursor_len(&self) -> usize {
        self.cursor.as_ref().map_or(0, |c| c.positions.len())
    }

    /// Records that the client has been told `subject` up to `position`,
    /// if a cursor is kept. The engine hands a worker each subject's
    /// publications in order, so the last one told is the furthest.
    pub fn advance(&mut self, subject: &str, position: Position) {
        let Some(cursor) = self.cursor.as_mut() else {
            return;
        };
        if let Some(i) = self.subscriptions.iter().position(|s| &**s == subject) {
            let entry = cursor.entry(i) as usize;
            cursor.positions[entry] = Some(position);
        }
    }

    /// Appends the cursor's text (see `myriad_protocol::cursor`); nothing
    /// without one.
    pub fn write_cursor(&self, out: &mut Vec<u8>) {
        if let Some(cursor) = &self.cursor {
            write_cursor(&cursor.positions, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::Epoch;

    fn text(session: &Session) -> String {
        let mut out = Vec::new();
        session.write_cursor(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_cursor_follows_subscriptions_in_order() {
        let mut s = Session::default();
        let p = |o| Some(Position::new(Epoch(1), o));
        s.keep_cursor(&[None, p(3), None]);
        for name in ["a", "b", "c"] {
            s.subscriptions.push(Arc::from(name));
        }
        s.advance("a", Position::new(Epoch(1), 5));
        s.advance("c", Position::new(Epoch(2), 0));
        s.advance("d", Position::new(Epoch(2), 0)); // not held: ignored
        assert_eq!(
            text(&s),
            "0000000000000001:5,0000000000000001:3,0000000000000002:0"
        );
        assert_eq!(&*s.take_all()[0], "a");
        assert!(!s.keeps_cursor());
        assert_eq!(text(&s), "");
    }

    #[test]
    fn a_subject_dropped_keeps_its_entry_and_the_others_still_move() {
        let mut s = Session::default();
        let p = |e, o| Some(Position::new(Epoch(e), o));
        s.keep_cursor(&[p(1, 1), None, p(3, 3), None]);
        for name in ["a", "b", "c", "d"] {
            s.subscriptions.push(Arc::from(name));
        }
        // Dropped out of order: the entries after each still find theirs.
        s.remove("c");
        s.remove("a");
        assert_eq!(s.cursor_len(), 4, "one entry per subject of the URL");
        assert_eq!(text(&s), "0000000000000001:1,,0000000000000003:3,");
        s.advance("b", Position::new(Epoch(2), 5));
        s.advance("d", Position::new(Epoch(4), 6));
        s.advance("a", Position::new(Epoch(9), 9)); // not held: ignored
        assert_eq!(
            text(&s),
            "0000000000000001:1,0000000000000002:5,0000000000000003:3,0000000000000004:6"
        );
        s.remove("d");
        s.remove("b");
        assert!(s.subscriptions.is_empty());
        assert_eq!(
            text(&s),
            "0000000000000001:1,0000000000000002:5,0000000000000003:3,0000000000000004:6"
        );
    }

    #[test]
    fn the_cursor_settles_once_every_subject_is_answered() {
        let mut s = Session::default();
        assert!(!s.answered() && !s.cursor_settled(), "no cursor kept");
        s.keep_cursor(&[None, None]);
        assert!(!s.cursor_settled());
        assert!(!s.answered(), "one of two");
        assert!(s.answered(), "the last one");
        assert!(s.cursor_settled());
        assert!(!s.answered(), "told once");
        assert!(s.cursor_settled());
        assert!(!s.take_owed_cursor());
        assert!(s.owe_cursor() && !s.owe_cursor(), "owed once");
        assert!(s.take_owed_cursor() && !s.take_owed_cursor());
    }
}
