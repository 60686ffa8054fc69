//! Protocol profiles: how to talk pub/sub to a particular server.
//!
//! Everything the bench sends beyond RFC 6455 comes from a profile: the
//! subscribe text, the publish text (WebSocket) or request (HTTP), the
//! replies that mean "subscribed" or "error", and the marker that precedes
//! the publish timestamp in a delivered frame. `--profile myriad` (the
//! default) and `--profile generic` are shipped in `profiles/`; any other
//! value is read as a TOML or JSON file with the same fields, so the same
//! tool can load another server.

use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The profiles built into the binary, by name.
const SHIPPED: [(&str, &str); 2] = [
    ("myriad", include_str!("../../profiles/myriad.toml")),
    ("generic", include_str!("../../profiles/generic.toml")),
];

/// Why a profile could not be loaded.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// Not a shipped name, and the file could not be read.
    #[error("profile {path:?}: {source}")]
    Read {
        /// The name or path given.
        path: String,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The TOML did not have the profile's shape.
    #[error("profile {path:?}: {source}")]
    Toml {
        /// The name or path given.
        path: String,
        /// The parser's complaint.
        source: Box<toml::de::Error>,
    },
    /// The JSON did not have the profile's shape.
    #[error("profile {path:?}: {source}")]
    Json {
        /// The name or path given.
        path: String,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// A template used a placeholder this field does not offer.
    #[error("profile field {field}: unknown placeholder {{{placeholder}}}")]
    Placeholder {
        /// The template's field name.
        field: &'static str,
        /// The unknown placeholder's name.
        placeholder: String,
    },
    /// HTTP publishing was asked for, but the profile has no `http_publish`.
    #[error("profile {0:?} has no [http_publish] section")]
    NoHttp(String),
}

/// A server's pub/sub dialect, as loaded from TOML or JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Shown in reports.
    pub name: String,
    /// Text frame every subscribing connection sends after the handshake;
    /// none means connections only listen.
    #[serde(default)]
    pub subscribe: Option<String>,
    /// Substring of the reply that confirms the subscribe; without it a
    /// connection counts as subscribed once `subscribe` is sent.
    #[serde(default)]
    pub subscribe_ack: Option<String>,
    /// Substring of a reply that reports an error, counted by the bench.
    #[serde(default)]
    pub error_marker: Option<String>,
    /// Text frame of one publish over WebSocket.
    pub publish: String,
    /// The text right before the timestamp digits in a delivered frame.
    pub timestamp_marker: String,
    /// Publishing over HTTP, when the server offers it.
    #[serde(default)]
    pub http_publish: Option<HttpPublish>,
}

/// An HTTP publish request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPublish {
    /// Request path of the POST.
    pub path: String,
    /// Request body.
    pub body: String,
    /// Header that carries `--publish-key` (or `--admin-key`), if the
    /// server wants one.
    #[serde(default)]
    pub api_key_header: Option<String>,
}

impl Profile {
    /// A shipped profile by name, or a TOML/JSON file by path.
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        let (text, is_json) = match SHIPPED.iter().find(|(name, _)| *name == name_or_path) {
            Some((_, text)) => ((*text).to_owned(), false),
            None => {
                let text =
                    std::fs::read_to_string(name_or_path).map_err(|source| ProfileError::Read {
                        path: name_or_path.to_owned(),
                        source,
                    })?;
                let is_json = Path::new(name_or_path)
                    .extension()
                    .is_some_and(|e| e == "json");
                (text, is_json)
            }
        };
        let path = name_or_path.to_owned();
        let profile: Profile = if is_json {
            serde_json::from_str(&text).map_err(|source| ProfileError::Json { path, source })?
        } else {
            toml::from_str(&text).map_err(|source| ProfileError::Toml {
                path,
                source: Box::new(source),
            })?
        };
        profile.check()?;
        Ok(profile)
    }

    /// Checks every template's placeholders now, so workers never meet a
    /// broken template mid-run.
    fn check(&self) -> Result<(), ProfileError> {
        if let Some(t) = &self.subscribe {
            Template::compile("subscribe", t)?;
        }
        Template::compile("publish", &self.publish)?;
        if let Some(h) = &self.http_publish {
            Template::compile("http_publish.body", &h.body)?;
        }
        Ok(())
    }

    /// The HTTP publish section, or an error naming the profile.
    pub fn http(&self) -> Result<&HttpPublish, ProfileError> {
        self.http_publish
            .as_ref()
            .ok_or_else(|| ProfileError::NoHttp(self.name.clone()))
    }
}

/// One piece of a compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Subjects,
    Subject,
    Data,
    Id,
}

/// The values a template is rendered with; a placeholder whose value is
/// absent renders empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct Values<'a> {
    /// The connection's subjects, for `{subjects}` (as a JSON array) and
    /// `{subject}` (the first one).
    pub subjects: &'a [String],
    /// The publish data JSON, for `{data}`.
    pub data: &'a str,
    /// A request id, for `{id}`.
    pub id: u64,
}

/// A template split once into text and placeholders, rendered many times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Splits `text` at `{name}` placeholders. Braces that do not form a
    /// known placeholder name are an error when they look like one (a
    /// lowercase word) and plain text otherwise (JSON's own braces).
    pub fn compile(field: &'static str, text: &str) -> Result<Template, ProfileError> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let name_len = after
                .bytes()
                .take_while(|b| b.is_ascii_lowercase() || *b == b'_')
                .count();
            if name_len == 0 || !after[name_len..].starts_with('}') {
                lit.push_str(&rest[..=open]);
                rest = after;
                continue;
            }
            let part = match &after[..name_len] {
                "subjects" => Part::Subjects,
                "subject" => Part::Subject,
                "data" => Part::Data,
                "id" => Part::Id,
                other => {
                    return Err(ProfileError::Placeholder {
                        field,
                        placeholder: other.to_owned(),
                    })
                }
            };
            lit.push_str(&rest[..open]);
            if !lit.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut lit)));
            }
            parts.push(part);
            rest = &after[name_len + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        Ok(Template { parts })
    }

    /// Appends the rendered template to `out`.
    pub fn render(&self, v: &Values<'_>, out: &mut String) {
        use std::fmt::Write;
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Subject => out.push_str(v.subjects.first().map_or("", String::as_str)),
                Part::Subjects => {
                    out.push('[');
                    for (i, s) in v.subjects.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push('"');
                        out.push_str(s);
                        out.push('"');
                    }
                    out.push(']');
                }
                Part::Data => out.push_str(v.data),
                // Writing to a String cannot fail.
                Part::Id => {
                    let _ = write!(out, "{}", v.id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profiles_load() {
        let m = Profile::load("myriad").unwrap();
        assert_eq!(m.name, "myriad");
        assert!(m.http().is_ok());
        let g = Profile::load("generic").unwrap();
        assert!(g.subscribe_ack.is_none());
        assert!(g.http().is_err());
    }

    #[test]
    fn myriad_templates_render_protocol_v1() {
        // Checked against the protocol crate's own encoders, which the
        // server's tests hold to docs/protocol.md, so a change of the
        // protocol that the profile misses fails here.
        use myriad_protocol::message::{
            encode_error, encode_publish, encode_subscribe, encode_subscribed, write_publication,
            ErrorCode,
        };
        use myriad_protocol::position::{Epoch, Position};

        use crate::util::payload::{Stamp, StampFinder};

        let m = Profile::load("myriad").unwrap();
        let subjects = vec!["/p/s1".to_owned(), "/p/s2".to_owned()];
        let mut out = String::new();
        Template::compile("subscribe", m.subscribe.as_deref().unwrap())
            .unwrap()
            .render(
                &Values {
                    subjects: &subjects,
                    id: 1,
                    ..Values::default()
                },
                &mut out,
            );
        assert_eq!(out, encode_subscribe(&["/p/s1", "/p/s2"], Some(1)));
        out.clear();
        Template::compile("publish", &m.publish).unwrap().render(
            &Values {
                subjects: &subjects[..1],
                data: r#"{"ts":1}"#,
                id: 0,
            },
            &mut out,
        );
        assert_eq!(out, encode_publish("/p/s1", r#"{"ts":1}"#, None));

        // The replies the profile waits for are in what the node sends.
        let at = Position::new(Epoch(7), 3);
        let ack = m.subscribe_ack.as_deref().unwrap();
        assert!(encode_subscribed(Some(1), "/p/s1", at, None).contains(ack));
        assert!(!encode_error(Some(1), ErrorCode::InvalidSubject, "x").contains(ack));
        let error = m.error_marker.as_deref().unwrap();
        assert!(encode_error(Some(1), ErrorCode::InvalidSubject, "x").contains(error));
        assert!(!encode_subscribed(Some(1), "/p/s1", at, None).contains(error));

        // And the stamp is found in a delivery as the node encodes it.
        let mut delivery = Vec::new();
        write_publication(&mut delivery, "/p/s1", at, r#"{"ts":1234,"n":5,"pad":"x"}"#);
        assert_eq!(
            StampFinder::new(&m.timestamp_marker).find(&delivery),
            Some(Stamp {
                ts_ns: 1234,
                n: Some(5)
            })
        );
    }

    #[test]
    fn unknown_placeholders_are_rejected() {
        assert!(matches!(
            Template::compile("publish", "{\"a\":{nope}}"),
            Err(ProfileError::Placeholder { .. })
        ));
        // JSON braces are text.
        let t = Template::compile("publish", r#"{"x":{"y":1}}"#).unwrap();
        let mut out = String::new();
        t.render(&Values::default(), &mut out);
        assert_eq!(out, r#"{"x":{"y":1}}"#);
    }

    #[test]
    fn loads_json_files() {
        let dir = std::env::temp_dir().join(format!("myriad-bench-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.json");
        std::fs::write(
            &path,
            r#"{"name":"x","publish":"{data}","timestamp_marker":"\"ts\":"}"#,
        )
        .unwrap();
        let p = Profile::load(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, "x");
        assert!(p.subscribe.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
