//! The hook settings and the checks that refuse a bad one at start, each
//! error naming its setting.

use std::time::Duration;

use thiserror::Error;

use super::event::EventKind;

/// The shortest `hook_secret` accepted: 32 bytes, the HMAC-SHA256 output
/// size, below which the key is weaker than the tag (RFC 2104 §3).
pub const MIN_SECRET_LEN: usize = 32;

/// Where and how lifecycle events are delivered.
#[derive(Clone)]
pub struct HookSettings {
    /// `hook_url`: the receiver, `http://` or `https://` only.
    pub url: String,
    /// `backend_ca_file`: the authorities an `https://` receiver's
    /// certificate is checked against; `None`, the system's roots.
    pub ca: Option<std::path::PathBuf>,
    /// `hook_secret`: the HMAC key, at least [`MIN_SECRET_LEN`] bytes.
    pub secret: Vec<u8>,
    /// `hook_events`: which kinds go out.
    pub events: Vec<EventKind>,
    /// `hook_delay`: how long `vacated` and `offline` are held, so a quick
    /// return cancels them (default 5 s).
    pub delay: Duration,
    /// `hook_batch_window`: how long the first ready event waits for
    /// others to share its request (default 100 ms).
    pub batch_window: Duration,
    /// `hook_batch_size`: the most events in one request (default 100).
    pub batch_size: usize,
    /// `hook_queue`: the most events held or waiting; more are dropped and
    /// counted (default 100,000).
    pub queue_bound: usize,
    /// `hook_retries`: how many times a batch is sent again after a
    /// retryable failure before it is dropped and counted (default 8).
    pub retry_bound: u32,
    /// `hook_backoff`: the first retry's wait, doubled each retry up to
    /// 30 s (default 500 ms).
    pub backoff: Duration,
}

/// The longest wait between two tries of one batch.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl std::fmt::Debug for HookSettings {
    /// Everything but the secret, which no log may show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookSettings")
            .field("url", &self.url)
            .field("ca", &self.ca)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .field("events", &self.events)
            .field("delay", &self.delay)
            .field("batch_window", &self.batch_window)
            .field("batch_size", &self.batch_size)
            .field("queue_bound", &self.queue_bound)
            .field("retry_bound", &self.retry_bound)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl HookSettings {
    /// The settings with every default, for `url` and `secret`.
    pub fn new(url: impl Into<String>, secret: impl Into<Vec<u8>>) -> HookSettings {
        HookSettings {
            url: url.into(),
            ca: None,
            secret: secret.into(),
            events: EventKind::ALL.to_vec(),
            delay: Duration::from_secs(5),
            batch_window: Duration::from_millis(100),
            batch_size: 100,
            queue_bound: 100_000,
            retry_bound: 8,
            backoff: Duration::from_millis(500),
        }
    }

    /// Refuses a setting the node cannot deliver with.
    pub fn check(&self) -> Result<(), HookSettingsError> {
        let uri: hyper::Uri = self
            .url
            .parse()
            .map_err(|_| HookSettingsError::Url(self.url.clone()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(HookSettingsError::Url(self.url.clone()));
        }
        if self.secret.len() < MIN_SECRET_LEN {
            return Err(HookSettingsError::Secret(self.secret.len()));
        }
        if self.batch_size == 0 {
            return Err(HookSettingsError::Zero("hook_batch_size"));
        }
        if self.queue_bound == 0 {
            return Err(HookSettingsError::Zero("hook_queue"));
        }
        Ok(())
    }

    /// The wait before try number `retry` (1 for the first retry):
    /// `backoff` doubled per retry, capped at [`MAX_BACKOFF`].
    pub fn backoff_before(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(20);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(MAX_BACKOFF)
    }
}

/// Parses `hook_events`: comma-separated kind names, e.g. `online,offline`.
pub fn parse_events(text: &str) -> Result<Vec<EventKind>, HookSettingsError> {
    text.split(',')
        .map(str::trim)
        .filter(|word| !word.is_empty())
        .map(|word| {
            EventKind::ALL
                .into_iter()
                .find(|kind| kind.name() == word)
                .ok_or_else(|| HookSettingsError::Event(word.to_owned()))
        })
        .collect()
}

/// Why the hook settings were refused at start.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HookSettingsError {
    #[error("hook_url {0:?} is not an http:// or https:// URL with a host")]
    Url(String),
    #[error("hook_secret is {0} bytes; it must be at least {MIN_SECRET_LEN}")]
    Secret(usize),
    #[error("hook_events: unknown event {0:?} (occupied, vacated, online, offline, join, leave)")]
    Event(String),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn http_and_https_accepted() {
        assert_eq!(
            HookSettings::new("http://127.0.0.1:9/h", *SECRET).check(),
            Ok(())
        );
        assert_eq!(
            HookSettings::new("https://example.test/h", *SECRET).check(),
            Ok(())
        );
    }

    #[test]
    fn other_urls_refused_naming_the_setting() {
        for url in ["ftp://example.test/", "example.test/h", "", "http://"] {
            let err = HookSettings::new(url, *SECRET).check().unwrap_err();
            assert_eq!(err, HookSettingsError::Url(url.to_owned()), "{url}");
            assert!(err.to_string().starts_with("hook_url"));
        }
    }

    #[test]
    fn short_secret_refused_naming_the_setting() {
        let err = HookSettings::new("http://a/", &SECRET[..31])
            .check()
            .unwrap_err();
        assert_eq!(err, HookSettingsError::Secret(31));
        assert!(err.to_string().starts_with("hook_secret"));
    }

    #[test]
    fn events_parsed_and_unknown_refused() {
        assert_eq!(
            parse_events("online, offline").unwrap(),
            vec![EventKind::Online, EventKind::Offline]
        );
        assert_eq!(
            parse_events("online,gone"),
            Err(HookSettingsError::Event("gone".to_owned()))
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let s = HookSettings::new("http://a/", *SECRET);
        assert_eq!(s.backoff_before(1), Duration::from_millis(500));
        assert_eq!(s.backoff_before(2), Duration::from_millis(1000));
        assert_eq!(s.backoff_before(4), Duration::from_millis(4000));
        assert_eq!(s.backoff_before(40), MAX_BACKOFF);
    }
}
