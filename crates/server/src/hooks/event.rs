//! One lifecycle event and the key its ordering is kept by.

use serde::Serialize;

/// What happened. The names are the `type` field of the JSON body and the
/// words of the `hook_events` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A subject's first subscriber.
    Occupied,
    /// A subject's last subscriber gone; held for `hook_delay`.
    Vacated,
    /// A user's first connection.
    Online,
    /// A user's last connection gone; held for `hook_delay`.
    Offline,
    /// A member joined a presence subject.
    Join,
    /// A member left a presence subject.
    Leave,
}

impl EventKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [EventKind; 6] = [
        EventKind::Occupied,
        EventKind::Vacated,
        EventKind::Online,
        EventKind::Offline,
        EventKind::Join,
        EventKind::Leave,
    ];

    /// The word used in the body and in `hook_events`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Occupied => "occupied",
            EventKind::Vacated => "vacated",
            EventKind::Online => "online",
            EventKind::Offline => "offline",
            EventKind::Join => "join",
            EventKind::Leave => "leave",
        }
    }

    /// The kind an event of this kind undoes when it arrives within the
    /// delay: a subject occupied again cancels its held `vacated`, a user
    /// back online cancels its held `offline`.
    pub fn cancels(self) -> Option<EventKind> {
        match self {
            EventKind::Occupied => Some(EventKind::Vacated),
            EventKind::Online => Some(EventKind::Offline),
            _ => None,
        }
    }

    /// Whether events of this kind wait `hook_delay` before they go out.
    pub fn delayed(self) -> bool {
        matches!(self, EventKind::Vacated | EventKind::Offline)
    }
}

/// What an event is about; events of one key are never reordered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Subject(String),
    User(String),
}

/// One event as the receiver sees it in the body's `events` array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Unique per node and event (the node name and a counter), so the
    /// receiver can drop a batch it already took when a retry repeats it.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// When it happened, milliseconds since the Unix epoch.
    pub time: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The node the event comes from.
    pub node: String,
}

impl Event {
    /// The key that orders this event: its subject, else its user.
    pub fn key(&self) -> Key {
        match (&self.subject, &self.user) {
            (Some(subject), _) => Key::Subject(subject.clone()),
            (None, Some(user)) => Key::User(user.clone()),
            (None, None) => Key::User(String::new()),
        }
    }
}
