//! Protocol v1 commands on the pub/sub endpoint, and the subscription
//! bookkeeping they drive across the connection, the worker's registry and
//! the hub.
//!
//! A subscription is recorded in three places that must agree: the
//! connection's own list (to clean up when it closes), the worker's registry
//! (for local fan-out) and the hub (which workers to send to). Every change
//! goes through [`Worker::add_subscription`] or [`Worker::unsubscribe_all`] /
//! [`Worker::remove_subscription`] so they cannot drift apart.

use std::borrow::Cow;
use std::sync::Arc;

use myriad_protocol::message::{
    encode_error, encode_ok, encode_pong, parse_command, Command, ErrorCode,
};

use super::{Flow, Worker};
use crate::metrics::ErrorKind;
use crate::registry::{Change, ConnId};

impl Worker {
    /// Handles one text message on the pub/sub endpoint.
    pub(super) fn on_command(&mut self, id: ConnId, text: &str) -> Flow {
        let command = match parse_command(text, self.shared.config.max_subject_len) {
            Ok(command) => command,
            Err(e) => {
                self.refuse(id, e.id, e.code, &e.detail);
                return Flow::Continue;
            }
        };
        let request = command.id();
        match command {
            Command::Subscribe { subjects, .. } => {
                let held = &self.conns[id as usize].subscriptions;
                let mut new: Vec<&Cow<'_, str>> = Vec::new();
                for s in &subjects {
                    if !held.iter().any(|h| **h == **s) && !new.contains(&s) {
                        new.push(s);
                    }
                }
                let limit = self.shared.config.max_subscriptions;
                if held.len() + new.len() > limit {
                    let detail = format!(
                        "{} held + {} new would pass the limit of {limit}",
                        held.len(),
                        new.len()
                    );
                    self.refuse(id, request, ErrorCode::TooManySubscriptions, &detail);
                    return Flow::Continue;
                }
                for subject in new {
                    self.add_subscription(id, subject);
                }
                self.acknowledge(id, request);
            }
            Command::Unsubscribe { subjects, .. } => {
                for subject in &subjects {
                    self.remove_subscription(id, subject);
                }
                self.acknowledge(id, request);
            }
            Command::Publish { subject, data, .. } => {
                match self
                    .shared
                    .engine
                    .publish(&subject, data.get(), &mut self.wakeups)
                {
                    Ok(published) => {
                        self.shared.metrics.published(published.seq.is_some());
                        self.acknowledge(id, request);
                    }
                    Err(e) => {
                        self.refuse(id, request, ErrorCode::PublishFailed, &e.to_string());
                    }
                }
                if self.shared.engine.congested() {
                    return Flow::Pause;
                }
            }
            Command::Ping { .. } => self.send_text(id, &encode_pong(request)),
        }
        Flow::Continue
    }

    fn acknowledge(&mut self, id: ConnId, request: Option<u64>) {
        if let Some(request) = request {
            self.send_text(id, &encode_ok(request));
        }
    }

    fn refuse(&mut self, id: ConnId, request: Option<u64>, code: ErrorCode, detail: &str) {
        self.shared.metrics.error(ErrorKind::Command(code));
        self.send_text(id, &encode_error(request, code, detail));
    }

    /// Subscribes `id` to `subject` (not yet held), sharing one allocation of
    /// the name between connection, registry and hub where it already exists.
    fn add_subscription(&mut self, id: ConnId, subject: &str) {
        let name = self
            .registry
            .interned(subject)
            .unwrap_or_else(|| Arc::from(subject));
        let change = self.registry.subscribe(&name, id);
        self.shared
            .hub
            .subscribe(&name, self.index, change == Change::FirstLocal);
        self.conns[id as usize].subscriptions.push(name);
        self.metrics.subscriptions.inc();
    }

    fn remove_subscription(&mut self, id: ConnId, subject: &str) {
        let held = &mut self.conns[id as usize].subscriptions;
        if let Some(i) = held.iter().position(|h| &**h == subject) {
            let name = held.swap_remove(i);
            self.forget(id, &name);
        }
    }

    /// Drops every subscription of `id` (closing, or closed).
    pub(super) fn unsubscribe_all(&mut self, id: ConnId) {
        let held = std::mem::take(&mut self.conns[id as usize].subscriptions);
        for name in &held {
            self.forget(id, name);
        }
    }

    fn forget(&mut self, id: ConnId, name: &str) {
        let change = self.registry.unsubscribe(name, id);
        debug_assert_ne!(
            change,
            Change::Unchanged,
            "registry and connection disagree"
        );
        self.shared
            .hub
            .unsubscribe(name, self.index, change == Change::LastLocal);
        self.metrics.subscriptions.dec();
    }
}
